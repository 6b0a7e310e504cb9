// Every numeric flag of every command, fed the values a careless user types: each must
// be a one-line error naming the flag and a non-zero exit, never a crash, a hang, a
// silent clamp, an empty string read as 0, or NaN/infinity let through (issue 17). The
// commands come from the binary's own command registry (each --help's subcommands, so
// `bench reach` and `bench all` are swept too) and the flags from each command's --help,
// so a new command or flag is swept without listing it. Each flag gets the values that
// tell a validated flag from CLI11's own parsing ('' read as 0, a clamped 20-digit
// number, a fraction, NaN for reals, a seed of -1) and one more of the careless list in
// turn; the parser's answer to every value of that list is tested in-process
// (flags_test.cc), so the sweep's process per value is spent only where a flag could differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::run_cli;

struct Flag {
  std::string name, type;  // type: INT, UINT, FLOAT or TEXT as --help shows it
};

// The names under "Subcommands:" in `<command> --help` ("" for the top level).
std::vector<std::string> subcommands(const std::string& command) {
  CliRun help = run_cli(command + " --help", 30);
  EXPECT_EQ(help.code, 0) << command << ": " << help.err;
  std::vector<std::string> out;
  std::istringstream in(help.out);
  bool listing = false;
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("Subcommands:", 0) == 0) {
      listing = true;
      continue;
    }
    if (!listing || l.rfind("  ", 0) != 0) continue;
    std::istringstream words(l);
    std::string name;
    if (words >> name) out.push_back(name);
  }
  return out;
}

// Every leaf command of the registry: the top level's, and the cases of each group
// (bench, verify) in place of the group.
std::vector<std::string> registered_commands() {
  std::vector<std::string> out;
  for (const std::string& top : subcommands("")) {
    const std::vector<std::string> cases = subcommands(top);
    if (cases.empty()) out.push_back(top);
    for (const std::string& c : cases) out.push_back(top + " " + c);
  }
  return out;
}

std::vector<Flag> numeric_flags(const std::string& command) {
  CliRun help = run_cli(command + " --help", 30);
  EXPECT_EQ(help.code, 0) << command << ": " << help.err;
  std::vector<Flag> out;
  // Lines such as "  --tokens INT=4096   Tokens per rank" (std::regex is avoided: GCC 12
  // warns falsely inside it under the sanitizers). A flag with an old name shows both
  // ("--seq-len,--context TEXT"): the first is the one errors name.
  std::istringstream in(help.out);
  for (std::string l; std::getline(in, l);) {
    std::istringstream words(l);
    std::string name, type;
    if (!(words >> name >> type) || name.rfind("--", 0) != 0) continue;
    name = name.substr(0, name.find(','));
    type = type.substr(0, type.find('='));
    if (type == "INT" || type == "UINT" || type == "FLOAT" || type == "TEXT") out.push_back({name, type});
  }
  return out;
}

TEST(FlagSweep, EveryNumericFlagRefusesWhatIsNotANumberInItsRange) {
  const std::vector<std::string> commands = registered_commands();
  // The registry was read: these are among its commands (never swept by the old hand list).
  for (const char* c : {"plan", "train", "bench reach", "bench all", "verify attention"})
    ASSERT_NE(std::find(commands.begin(), commands.end(), c), commands.end()) << c << " not found in the registry";
  // Not a number, or nothing at all: always refused. Past any sensible range: refused,
  // one line naming the flag. The few flags whose range is genuinely unbounded take huge
  // values (a Zipf exponent of 1e300 routes everything to one expert; a clip norm of 1e20
  // never clips); their behaviour there is tested where it lives
  // (DispatchCli.HugeZipfExponentsFinish), and a full default run is too slow here.
  const std::vector<std::string> careless = {"abc", "nan", "1x", "inf", "-inf", "-99999999999999999999", "1e300"};
  const std::vector<std::string> unbounded = {"--zipf-s", "--max-grad-norm"};
  int tried = 0, flags = 0, turn = 0;
  auto refused = [&](const std::string& cmd, const Flag& f, const std::string& v) {
    CliRun r = run_cli(cmd + " " + f.name + " " + v, 30);
    ++tried;
    SCOPED_TRACE(cmd + " " + f.name + " " + v);
    testing::expect_one_line_error(r, f.type == "TEXT" ? "" : f.name);
  };
  for (const std::string& cmd : commands) {
    for (const Flag& f : numeric_flags(cmd)) {
      // An empty string: never silently 0 or a default.
      refused(cmd, f, "''");
      if (f.type == "TEXT") continue;
      ++flags;
      const bool is_unbounded = std::find(unbounded.begin(), unbounded.end(), f.name) != unbounded.end();
      if (f.type == "FLOAT") refused(cmd, f, "nan");                 // CLI11 lets NaN through range checks
      if (!is_unbounded) refused(cmd, f, "99999999999999999999");  // CLI11 clamps it to the type's maximum
      if (f.type != "FLOAT") refused(cmd, f, "1.5");                 // integers refuse fractions
      if (f.type == "UINT") refused(cmd, f, "-1");                   // a seed of -1 must not wrap to 2^64 - 1
      // One more of the careless values, in turn over the flags (every value reaches many).
      std::string v = careless[static_cast<std::size_t>(turn++) % careless.size()];
      if (is_unbounded && v == "1e300") v = "abc";
      refused(cmd, f, v);
    }
  }
  RecordProperty("invocations", tried);
  std::printf("swept %d numeric flags of %zu commands with %d invocations\n", flags, commands.size(), tried);
}

// `--config FILE` (cli/config_file.h) is not numeric: --help shows it as FILE, so the
// sweep above passes it by. Every command that takes it refuses an empty name and a
// missing file, one line each naming the flag or the file.
TEST(FlagSweep, EveryConfigFlagRefusesAnEmptyOrMissingFile) {
  const std::vector<std::string> commands = {"plan", "train"};
  for (const std::string& cmd : commands) {
    CliRun help = run_cli(cmd + " --help", 30);
    ASSERT_NE(help.out.find("--config FILE"), std::string::npos) << cmd << " shows no --config FILE in --help";
    SCOPED_TRACE(cmd);
    testing::expect_one_line_error(run_cli(cmd + " --config ''", 30), "--config must not be empty");
    testing::expect_one_line_error(run_cli(cmd + " --config /nonexistent/flags.toml", 30),
                                   "/nonexistent/flags.toml: cannot read");
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
