// `--config FILE` reads TOML as TOML (toml++): multi-line and literal strings, escapes,
// integer spellings, comments; and only regular files are opened (a FIFO would block in
// open, a directory has no text).
#include "peakbound/cli/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "peakbound/cli/flags.h"

namespace peakbound::cli {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Values {
  std::int64_t steps = 10;
  double lr = 0.001;
  std::string schedules = "none";
  std::vector<std::string> files;
};

struct TomlCli {
  CLI::App root{"test"};
  Values v;
  TomlCli() {
    CLI::App* cmd = root.add_subcommand("train", "a command");
    int_flag(cmd, "--steps", v.steps, "steps", 1, 100);
    real_flag(cmd, "--lr", v.lr, "learning rate", 0.0, 1.0);
    text_flag(cmd, "--schedules", v.schedules, "schedules");
    cmd->add_option("--files", v.files, "several values");
    add_config_flag(cmd);
  }
  void parse(const std::string& args) { root.parse("train " + args, false); }
};

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pb_toml_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string error_of(const std::string& args) {
  TomlCli c;
  try {
    c.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigFileToml, StringsAreTomlStrings) {
  TomlCli c;
  c.parse("--config " + write("strings.toml",
                              "schedules = \"a\\tb\\u00e9\\\"q\\\"\"\n"
                              "files = [\"\"\"\nfirst\\\n   line\"\"\", 'C:\\dir\\x', '''raw \\t''', \"x#y\"]\n"));
  EXPECT_EQ(c.v.schedules, "a\tb\xc3\xa9\"q\"");  // escapes decoded, not kept literally
  // A multi-line basic string drops its first newline and a line-ending backslash with the
  // blanks after it; literal strings keep backslashes; '#' inside a string is not a comment.
  EXPECT_EQ(c.v.files, (std::vector<std::string>{"firstline", "C:\\dir\\x", "raw \\t", "x#y"}));
}

TEST(ConfigFileToml, MultiLineStringKeepsItsNewlines) {
  TomlCli c;
  c.parse("--config " + write("multiline.toml", "schedules = \"\"\"\nllep\ndtp\"\"\"\nsteps = 3\n"));
  EXPECT_EQ(c.v.schedules, "llep\ndtp");
  EXPECT_EQ(c.v.steps, 3);  // the key after the string is read, and its line is right
}

TEST(ConfigFileToml, NumbersAreTomlNumbers) {
  TomlCli c;
  c.parse("--config " + write("numbers.toml", "steps = 0x1_0  # hex with an underscore\nlr = 25e-5\n"));
  EXPECT_EQ(c.v.steps, 16);
  EXPECT_EQ(c.v.lr, 25e-5);
  // A date is no flag value; errors name the line, the first in the file first.
  const std::string date = write("date.toml", "\nschedules = 1979-05-27\n");
  EXPECT_NE(error_of("--config " + date).find(date + ":2: 'schedules' holds a date or time"), std::string::npos)
      << error_of("--config " + date);
  const std::string bad = write("order.toml", "steps = 2\n\nlr = 7.0\na_unknown = 1\n");
  EXPECT_NE(error_of("--config " + bad).find(bad + ":3: --lr"), std::string::npos) << error_of("--config " + bad);
}

TEST(ConfigFileToml, ArrayOfTablesIsRefused) {
  const std::string t = write("aot.toml", "steps = 2\n[[files]]\nname = \"a\"\n");
  const std::string e = error_of("--config " + t);
  EXPECT_NE(e.find(t + ":"), std::string::npos) << e;
  EXPECT_NE(e.find("'files' holds a table"), std::string::npos) << e;
}

// Found by tests/fuzz: toml++ 3.3 reached __builtin_unreachable (undefined behaviour, an
// abort under UBSan) on some non-ASCII characters outside strings (U+00E9 here, and inside
// a malformed value); now malformed TOML, while non-ASCII text in strings and comments is kept.
TEST(ConfigFileToml, NonAsciiOutsideStringsIsRefusedInsideKept) {
  const std::string bad = write("nonascii.toml", "steps = 2\nlr = 1\xc3\xa9\n");
  const std::string e = error_of("--config " + bad);
  EXPECT_NE(e.find(bad + ":2: malformed TOML: "), std::string::npos) << e;
  const std::string in_value = write("nonascii_value.toml", "steps = 9999'77\xef\xb1\xbf 1\n");
  EXPECT_NE(error_of("--config " + in_value).find(in_value + ":1: malformed TOML: "), std::string::npos)
      << error_of("--config " + in_value);
  TomlCli c;
  c.parse("--config " + write("nonascii_ok.toml", "\xef\xbb\xbf# caf\xc3\xa9\nschedules = \"caf\xc3\xa9\" # \xc3\xa9\n"
                                                  "files = ['''\xc3\xa9''', \"\"\"x\"\"\"\"\"]\n"));
  EXPECT_EQ(c.v.schedules, "caf\xc3\xa9");
  EXPECT_EQ(c.v.files, (std::vector<std::string>{"\xc3\xa9", "x\"\""}));
}

TEST(ConfigFileToml, DirectoryIsNamedAsOne) {
  const std::string dir = ::testing::TempDir() + "/pb_toml_a_dir";
  std::filesystem::create_directories(dir);
  const std::string e = error_of("--config " + dir);
  EXPECT_NE(e.find("--config " + dir + " is a directory"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// A FIFO is refused before it is opened. A helper opens the FIFO's writing end, which
// blocks until a reader comes: had --config opened the FIFO, it would have read an empty
// file and parsed (the test fails instead of hanging); the test itself releases the
// helper afterwards.
TEST(ConfigFileToml, FifoIsRefusedWithoutOpeningIt) {
  const std::string fifo = ::testing::TempDir() + "/pb_toml_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
  });
  const std::string e = error_of("--config " + fifo);
  const int release = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // unblocks the writer
  writer.join();
  if (release >= 0) ::close(release);
  ::unlink(fifo.c_str());
  EXPECT_EQ(e, "--config " + fifo + " is not a regular file (a FIFO)");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cli
