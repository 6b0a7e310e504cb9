// scripts/tokenize_text.sh end to end: text files in, llm.c token files out, read back
// with TokenFile and compared with the `tokenizers` package's own encoding of each
// document (run separately in the same venv). Skips, saying why, when the venv cannot
// be made (no network); under CI (the CI variable set) that is a failure instead.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peakbound/io/token_file.h"
#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;

const std::string kScript = std::string(PEAKBOUND_SOURCE_DIR) + "/scripts/tokenize_text.sh";

CliRun sh(const std::string& command, int timeout = 120) { return testing::run_cli("", timeout, command); }

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::int32_t> all_tokens(const TokenFile& f) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(f.tokens()));
  f.read(0, f.tokens(), v.data());
  return v;
}

// The venv's python, made on first use; "" when it cannot be made here.
std::string venv_python(std::string& why) {
  CliRun r = sh("bash " + kScript + " --print-python", 600);
  if (r.code != 0) {
    why = r.err;
    return "";
  }
  return r.out.substr(0, r.out.find('\n'));
}

TEST(TokenizeText, TokenFilesMatchTheTokenizersOwnEncoding) {
  std::string why;
  const std::string python = venv_python(why);
  if (python.empty()) {
    if (std::getenv("CI") != nullptr) FAIL() << "CI must be able to create the tokenizers venv: " << why;
    GTEST_SKIP() << "cannot create the tokenizers venv (no network?): " << why;
  }
  const std::string dir = ::testing::TempDir() + "/pb_tokenize_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  const std::vector<std::string> docs = {
      "The quick brown fox jumps over the lazy dog.\nThe dog sleeps; the fox runs.\n",
      "Second document: h\xc3\xa9llo w\xc3\xb6rld, 12345 tokens and    spaces.\n\nA blank line above.\n"};
  const std::string a = write(dir + "/a.txt", docs[0]), b = write(dir + "/b.txt", docs[1]);

  CliRun t = sh("bash " + kScript + " " + a + " " + b + " -o " + dir + "/out.bin --train-vocab 300 --eot --val-fraction 0.25");
  ASSERT_EQ(t.code, 0) << t.err;
  const nlohmann::json summary = nlohmann::json::parse(t.out);
  const std::string tokenizer = dir + "/tokenizer.json";  // saved beside the output
  EXPECT_EQ(summary["tokenizer"], tokenizer);
  EXPECT_EQ(summary["vocab_size"], 300);

  // The python tokenizer's own encoding of each document, and its decoding back.
  const std::string check = write(dir + "/check.py",
                                  "import json, sys\n"
                                  "from tokenizers import Tokenizer\n"
                                  "t = Tokenizer.from_file(sys.argv[1])\n"
                                  "docs = [open(p, encoding='utf-8').read() for p in sys.argv[2:]]\n"
                                  "ids = [t.encode(d, add_special_tokens=False).ids for d in docs]\n"
                                  "print(json.dumps({'ids': ids, 'eot': t.token_to_id('<|endoftext|>'),\n"
                                  "  'round_trip': all(t.decode(i, skip_special_tokens=False) == d for i, d in zip(ids, docs))}))\n");
  CliRun c = sh(python + " " + check + " " + tokenizer + " " + a + " " + b);
  ASSERT_EQ(c.code, 0) << c.err;
  const nlohmann::json ref = nlohmann::json::parse(c.out);
  EXPECT_TRUE(ref["round_trip"].get<bool>());
  std::vector<std::int32_t> expected = ref["ids"][0].get<std::vector<std::int32_t>>();
  expected.push_back(ref["eot"].get<std::int32_t>());  // --eot: between the documents only
  for (std::int32_t id : ref["ids"][1].get<std::vector<std::int32_t>>()) expected.push_back(id);
  ASSERT_GT(expected.size(), 20u);

  const TokenFile train = TokenFile::open(dir + "/out.bin"), val = TokenFile::open(dir + "/out.val.bin");
  EXPECT_TRUE(train.has_header());
  EXPECT_EQ(train.token_bytes(), 2);
  const auto n = static_cast<std::int64_t>(expected.size());
  const std::int64_t n_val = (n + 2) / 4;  // round(n / 4): the last quarter
  EXPECT_EQ(summary["tokens"], n);
  EXPECT_EQ(val.tokens(), n_val);
  EXPECT_EQ(train.tokens(), n - n_val);
  EXPECT_EQ(summary["val_tokens"], n_val);
  std::vector<std::int32_t> got = all_tokens(train);
  for (std::int32_t id : all_tokens(val)) got.push_back(id);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(summary["first_tokens"].get<std::vector<std::int32_t>>(),
            std::vector<std::int32_t>(expected.begin(), expected.begin() + 32));

  // The saved tokenizer reused: no end-of-text, no held-out file, the same tokens otherwise.
  CliRun u = sh("bash " + kScript + " " + a + " " + b + " -o " + dir + "/again --tokenizer " + tokenizer);
  ASSERT_EQ(u.code, 0) << u.err;
  std::vector<std::int32_t> plain = ref["ids"][0].get<std::vector<std::int32_t>>();
  for (std::int32_t id : ref["ids"][1].get<std::vector<std::int32_t>>()) plain.push_back(id);
  EXPECT_EQ(all_tokens(TokenFile::open(dir + "/again.bin")), plain);
  std::ifstream no_val(dir + "/again.val.bin");
  EXPECT_FALSE(no_val.good());

  // A vocabulary past 65536 entries: uint32 tokens under llm.c's other magic.
  const std::string wide = write(dir + "/wide.py",
                                 "import sys\n"
                                 "from tokenizers import Tokenizer, models, pre_tokenizers\n"
                                 "vocab = {f'w{i}': i for i in range(70000)}\n"
                                 "vocab['<|endoftext|>'] = 70000\n"
                                 "t = Tokenizer(models.WordLevel(vocab, unk_token='w0'))\n"
                                 "t.pre_tokenizer = pre_tokenizers.Whitespace()\n"
                                 "t.save(sys.argv[1])\n");
  CliRun w = sh(python + " " + wide + " " + dir + "/wide.json");
  ASSERT_EQ(w.code, 0) << w.err;
  const std::string wa = write(dir + "/wa.txt", "w1 w65535 w65536\n"), wb = write(dir + "/wb.txt", "w69999 w2");
  CliRun ww = sh("bash " + kScript + " " + wa + " " + wb + " -o " + dir + "/wide.bin --eot --tokenizer " + dir + "/wide.json");
  ASSERT_EQ(ww.code, 0) << ww.err;
  const TokenFile wf = TokenFile::open(dir + "/wide.bin");
  EXPECT_EQ(wf.token_bytes(), 4);
  EXPECT_EQ(all_tokens(wf), (std::vector<std::int32_t>{1, 65535, 65536, 70000, 69999, 2}));

  // Bad input: one line on stderr, exit 1.
  for (const std::string& args : {a + " -o " + dir + "/x.bin --tokenizer " + dir + "/missing.json",
                                  dir + "/missing.txt -o " + dir + "/x.bin --tokenizer " + tokenizer,
                                  a + " -o " + dir + "/x.bin --tokenizer " + tokenizer + " --val-fraction 1.5",
                                  a + " -o " + dir + "/x.bin --train-vocab 12",
                                  a + " -o " + dir + "/x.bin"}) {
    CliRun r = sh("bash " + kScript + " " + args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.err;
    EXPECT_EQ(testing::count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("tokenize_text: error: ", 0), 0u) << r.err;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
