// Runs the built `peakbound` binary as a user would (shared by the CLI tests): exit
// code, stdout and stderr of one invocation, and the one-line-error expectation.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace peakbound::testing {

struct CliRun {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs under coreutils `timeout`, so a hang fails the test (exit 124) instead of
// stalling the suite.
// `command`, when given, replaces "peakbound <args>" (run_mpi uses it).
inline CliRun run_cli(const std::string& args, int timeout_seconds = 120, const std::string& command = "") {
  static int n = 0;
  const std::string base = ::testing::TempDir() + "/pb_cli_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
  const std::string what = command.empty() ? std::string(PEAKBOUND_CLI_PATH) + " " + args : command;
  const std::string cmd = "timeout -k 5 " + std::to_string(timeout_seconds) + " " + what + " >" + base + ".out 2>" + base + ".err";
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

// `peakbound args` in the background, in its own process group (so a test can signal
// it and its children), output to `log`. With `timeout_seconds` > 0 it runs under
// coreutils `timeout`, so a run that ignores signals still ends (exit 124).
inline pid_t spawn_cli(const std::string& args, const std::string& log, int timeout_seconds = 0) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string limit = timeout_seconds > 0 ? "timeout -k 5 " + std::to_string(timeout_seconds) + " " : "";
    const std::string cmd = "exec " + limit + std::string(PEAKBOUND_CLI_PATH) + " " + args + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The exit code of a spawned run (128 + the signal when a signal ended it).
inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The binary under mpirun with `ranks` processes (shared memory without CMA, waiting
// ranks yield their core), all under the same timeout.
// `env`: more NAME=VALUE words for the launcher's environment (which every rank inherits).
inline CliRun run_mpi(const std::string& args, int ranks, int timeout_seconds = 120, const std::string& env = "") {
  return run_cli("", timeout_seconds, "env " + (env.empty() ? "" : env + " ") +
                                          "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1 "
                                      "OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --allow-run-as-root --oversubscribe -np " +
                                          std::to_string(ranks) + " " + std::string(PEAKBOUND_CLI_PATH) + " " + args);
}

// Whether `ulimit -v` can apply to the binary: AddressSanitizer reserves terabytes of
// shadow address space at start, so a sanitizer build cannot run under any such limit.
inline bool address_space_limits_apply() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#else
  return true;
#endif
}

// The binary under `ulimit -v kib` (KiB of address space), in a shell, timed likewise.
inline CliRun run_limited(const std::string& args, long kib, int timeout_seconds = 120) {
  return run_cli("", timeout_seconds,
                 "sh -c 'ulimit -v " + std::to_string(kib) + "; exec " + std::string(PEAKBOUND_CLI_PATH) + " " + args + "'");
}

// The last line of a command's output that starts with '{', parsed (commands print a JSON
// summary after their human-readable lines).
inline nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') last = line;
  return nlohmann::json::parse(last);
}

inline bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

inline void expect_one_line_error(const CliRun& r, const std::string& needle) {
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (a hang)";
  EXPECT_LT(r.code, 128) << "killed by a signal";
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("peakbound: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace peakbound::testing
