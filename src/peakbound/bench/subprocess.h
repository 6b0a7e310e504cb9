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

}  // namespace peakbound::bench
