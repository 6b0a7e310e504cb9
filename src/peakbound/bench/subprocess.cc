#include "peakbound/bench/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "peakbound/comm/single_copy.h"
#include "peakbound/core/error.h"

extern char** environ;

namespace peakbound::bench {

namespace {

// An unlinked temporary file: the child writes into it, the parent reads it back.
struct TempFile {
  int fd = -1;
  TempFile() {
    char name[] = "/tmp/peakbound-child-XXXXXX";
    fd = mkstemp(name);
    if (fd < 0) throw Error(std::string("cannot create a temporary file: ") + std::strerror(errno));
    unlink(name);
  }
  ~TempFile() {
    if (fd >= 0) close(fd);
  }
  std::string read_all() const {
    std::string s;
    char buf[65536];
    lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<std::size_t>(n));
    return s;
  }
};

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv) {
  if (argv.empty()) throw InvalidArgument("run_process: no program");
  TempFile out, err;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out.fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err.fd, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error("cannot start '" + argv[0] + "': " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error("waiting for '" + argv[0] + "': " + std::strerror(errno));
  }
  ProcessResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = out.read_all();
  r.err = err.read_all();
  return r;
}

std::vector<std::string> mpirun_argv(const std::string& mpirun, int ranks) {
  if (ranks == 1) return {};  // one process needs no launcher (a machine with one GPU may have no MPI)
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  // One-copy transfers where the kernel allows them (comm/single_copy.h); a value the
  // caller set wins.
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", mpi_single_copy_mechanism().c_str(), 0);
  std::vector<std::string> argv = {mpirun, "-np", std::to_string(ranks), "--oversubscribe"};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  return argv;
}

std::string error_line(const std::string& err) {
  const std::string tag = "peakbound: error: ";
  const std::size_t e = err.find(tag);
  if (e == std::string::npos) return "";
  const std::size_t end = err.find('\n', e);
  return err.substr(e + tag.size(), end == std::string::npos ? std::string::npos : end - e - tag.size());
}

namespace {

// The last line with something on it, at most 300 characters.
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const std::size_t begin = text.rfind('\n', end);
  std::string line = text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

}  // namespace

void require_program(const std::string& program, const std::string& flag) {
  auto runnable = [](const std::string& p) {
    std::error_code ec;
    return std::filesystem::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (!runnable(program)) throw InvalidArgument(flag + ": '" + program + "' is not an executable program");
    return;
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "";
  for (std::size_t b = 0;;) {
    const std::size_t e = dirs.find(':', b);
    const std::string d = dirs.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (runnable((d.empty() ? std::string(".") : d) + "/" + program)) return;
    if (e == std::string::npos) break;
    b = e + 1;
  }
  throw InvalidArgument(flag + ": '" + program +
                        "' is not a program on PATH (install an MPI launcher, give its path, or run with --ranks 1)");
}

std::string failure_reason(const std::vector<std::string>& argv, const ProcessResult& p) {
  if (std::string m = error_line(p.err); !m.empty()) return m;
  if (std::string m = last_line(p.err); !m.empty()) return m;
  if (std::string m = last_line(p.out); !m.empty()) return m;
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  const std::string how = p.exit_code > 128 ? "was killed by signal " + std::to_string(p.exit_code - 128)
                                            : "exited with status " + std::to_string(p.exit_code);
  return "`" + cmd + "` " + how + " and printed nothing";
}

std::string self_executable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find this program's path (/proc/self/exe): " + ec.message());
  return p.string();
}

}  // namespace peakbound::bench
