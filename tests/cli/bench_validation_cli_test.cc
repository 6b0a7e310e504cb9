// `bench reach` and `bench all` check every flag and input before their first job (issue
// 25): a budget no job can fit in, a peer JSON without the fields the comparison reads, a
// timeline folder that is a file, a reach budget of `bench all --with-reach`, a launcher
// that is not a program. A search where every job is refused exits non-zero naming the
// smallest job's refusal, and a launcher that fails without a word is named with its
// command line and exit status. Each search here is cut to one context on one rank (or two
// ranks with a launcher that fails at once), so a check that ran late still ends quickly.
#include <cctype>
#include <fstream>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::expect_one_line_error;
using testing::run_cli;

// One context (64 tokens) on one rank, schedules none: a search of one job.
const std::string kOneJob = "bench reach --ranks 1 --configs none --start 64 --multiple 64 --max-context 64 ";

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const std::size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST(BenchValidationCli, BudgetBelowTheFixedStateIsRefusedBeforeAnyJobNamingTheMinimum) {
  for (const char* budget : {"0", "1KiB"}) {
    const CliRun r = run_cli(kOneJob + "--budget " + budget, 60);
    expect_one_line_error(r, "--budget");
    EXPECT_NE(r.err.find("fixed state"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("at 64 tokens"), std::string::npos) << r.err;  // the smallest context
    EXPECT_NE(r.err.find(" bytes ("), std::string::npos) << r.err;      // the minimum, exact
    EXPECT_EQ(r.out, "");                                               // no table of zeros
  }
}

// The minimum the refusal names, read back from it.
std::int64_t named_minimum(const std::string& err) {
  const std::size_t at = err.find(" bytes (");
  if (at == std::string::npos) return -1;
  std::size_t b = at;
  while (b > 0 && std::isdigit(static_cast<unsigned char>(err[b - 1]))) --b;
  return std::stoll(err.substr(b, at - b));
}

TEST(BenchValidationCli, ASearchWhereEveryJobIsRefusedExitsNonZeroNamingWhy) {
  // Exactly the named minimum passes the check; the job then needs more (the embedding
  // gathered for its forward, activations) and is refused.
  const CliRun probe = run_cli(kOneJob + "--budget 0", 60);
  const std::int64_t least = named_minimum(probe.err);
  ASSERT_GT(least, 0) << probe.err;
  const CliRun r = run_cli(kOneJob + "--budget " + std::to_string(least) + " --json", 120);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(r.code, 128) << r.err;
  EXPECT_EQ(r.out, "");
  const std::string line = last_line(r.err);
  EXPECT_EQ(line.rfind("peakbound: error: ", 0), 0u) << r.err;
  EXPECT_NE(line.find("every job was refused"), std::string::npos) << line;
  EXPECT_NE(line.find("context 64"), std::string::npos) << line;
  EXPECT_NE(line.find("cannot allocate"), std::string::npos) << line;  // the arena's refusal itself
  // Checked before any job: a budget one byte short of the minimum.
  expect_one_line_error(run_cli(kOneJob + "--budget " + std::to_string(least - 1), 60), "--budget");
}

TEST(BenchValidationCli, PeerJsonWithoutTheFieldsItNeedsIsRefusedBeforeAnyJob) {
  const std::string empty = write_file("peer_empty.json", "{}\n");
  CliRun r = run_cli(kOneJob + "--budget 1GiB --peer-json " + empty, 60);
  expect_one_line_error(r, "reach_tokens");
  EXPECT_EQ(r.err.find("context"), std::string::npos) << "a job ran first: " << r.err;
  const std::string text = write_file("peer_text.json", "{\"reach_tokens\": \"many\", \"tokens_per_second_at_reach\": 1}\n");
  expect_one_line_error(run_cli(kOneJob + "--budget 1GiB --peer-json " + text, 60), "reach_tokens");
  const std::string none = write_file("peer_none.json", "not json\n");
  expect_one_line_error(run_cli(kOneJob + "--budget 1GiB --peer-json " + none, 60), "no JSON line");
  expect_one_line_error(run_cli(kOneJob + "--budget 1GiB --peer-json " + ::testing::TempDir(), 60), "folder");
  // A peer of the other precision (an output without "precision" was an fp32 run).
  const std::string bf16 = write_file(
      "peer_bf16.json", "{\"reach_tokens\": 832, \"tokens_per_second_at_reach\": 1.5, \"precision\": \"bf16\"}\n");
  const std::string old = write_file("peer_old.json", "{\"reach_tokens\": 704, \"tokens_per_second_at_reach\": 1.5}\n");
  for (const auto& [peer, flags] : {std::pair{bf16, std::string(" --precision f32")}, std::pair{old, std::string()}}) {
    const CliRun mixed = run_cli(kOneJob + "--budget 1GiB --peer-json " + peer + flags, 60);
    expect_one_line_error(mixed, "--precision");
    EXPECT_NE(mixed.err.find("run of bench/peer_fsdp2.py"), std::string::npos) << mixed.err;
    EXPECT_EQ(mixed.err.find("context"), std::string::npos) << "a job ran first: " << mixed.err;
  }
}

TEST(BenchValidationCli, TimelineDirThatIsAFileIsRefusedBeforeAnyJob) {
  const std::string file = write_file("timeline_is_a_file", "x");
  const CliRun r = run_cli(kOneJob + "--budget 1GiB --timeline-dir " + file, 60);
  expect_one_line_error(r, "--timeline-dir");
  EXPECT_NE(r.err.find("not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("context"), std::string::npos) << "a job ran first: " << r.err;
}

TEST(BenchValidationCli, ALauncherThatFailsSilentlyIsNamedWithItsExitStatus) {
  // `false` is a program: the check passes, the first job fails with no output.
  const CliRun r = run_cli(
      "bench reach --ranks 2 --mpirun false --configs none --start 64 --multiple 64 --max-context 64 --budget 1GiB", 60);
  EXPECT_NE(r.code, 0);
  const std::string line = last_line(r.err);
  EXPECT_EQ(line.rfind("peakbound: error: ", 0), 0u) << r.err;
  EXPECT_NE(line.find("`false -np 2"), std::string::npos) << line;
  EXPECT_NE(line.find("exited with status 1 and printed nothing"), std::string::npos) << line;
  // Not a program at all: refused before any job, by bench reach and by bench all.
  expect_one_line_error(run_cli("bench reach --ranks 2 --mpirun /nonexistent/mpirun --budget 1GiB", 60), "--mpirun");
  expect_one_line_error(run_cli("bench all --ranks 2 --benches optimizer --mpirun /nonexistent/mpirun", 60),
                        "--mpirun");
}

TEST(BenchValidationCli, BenchAllChecksTheReachBudgetBeforeTheSuite) {
  // Before: the whole suite ran first (minutes; the timeout here is far shorter).
  for (const char* budget : {"-5", "1KiB", "lots"}) {
    const CliRun r = run_cli(std::string("bench all --benches optimizer --with-reach --reach-budget ") + budget, 30);
    expect_one_line_error(r, "--reach-budget");
    EXPECT_EQ(r.err.find("bench optimizer"), std::string::npos) << "the suite ran first: " << r.err;
  }
  // Without --with-reach a bad value is still a bad flag.
  expect_one_line_error(run_cli("bench all --benches optimizer --reach-budget -5", 30), "negative");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
