// Runs a program to completion and captures what it printed: what `bench reach` uses to
// launch one training job per trial (mpirun ... peakbound train), so a trial that runs out
// of its budget ends only its own job.
#pragma once

#include <string>
#include <vector>

namespace peakbound::bench {

struct ProcessResult {
  int exit_code = 0;  // the exit status; 128 + N when killed by signal N
  std::string out, err;
};

// argv[0] is looked up on PATH. Throws Error when the program cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv);

// The path of the running executable (/proc/self/exe).
std::string self_executable();

// The start of a command line running `ranks` ranks under `mpirun`: -np, --oversubscribe
// (the benches run more ranks than cores on small machines), --allow-run-as-root as root.
// Also sets, unless the environment has them, OpenMPI's defaults for such jobs: waiting
// ranks yield their core, shared memory without cross-memory attach (containers).
// One rank needs no launcher: empty (the job runs directly).
std::vector<std::string> mpirun_argv(const std::string& mpirun, int ranks);

// Refuses (InvalidArgument naming `flag`) a `program` that run_process could not start:
// neither a path to an executable file nor an executable found on PATH.
void require_program(const std::string& program, const std::string& flag);

// The message of the first "peakbound: error: ..." line a child printed ("" if none).
std::string error_line(const std::string& err);

// Why a child that exited non-zero failed, in one line: its "peakbound: error:" line, else
// the last line it printed on stderr (or stdout), else the command line and its exit
// status (a launcher such as `--mpirun false` that fails without a word).
std::string failure_reason(const std::vector<std::string>& argv, const ProcessResult& p);

}  // namespace peakbound::bench
