// Checks of the file paths a user gives, made before anything is opened for writing:
// an input must be a regular file (or a folder where a folder is expected), an output
// must be absent or an existing regular file (never a FIFO, device, socket or folder:
// opening a FIFO blocks until a peer opens it, a rename over a device replaces the
// device), and no output may be the same file as an input or as another output (a
// truncating open of a file that a run has mapped kills it with SIGBUS and leaves the
// input empty). Each refusal is one InvalidArgument naming the flag, the path and why.
#pragma once

#include <string>
#include <vector>

namespace peakbound {

// A path and what gave it: a flag ("--data"), or a description ("plot-memory's input").
struct FlagPath {
  std::string flag;
  std::string path;
};

// What is wrong with `path` as an input file (empty: nothing). `expected` names what
// was wanted ("a token file"). The no-throw form is for callers that report errors in
// their own exception type (a CLI11 option callback).
std::string input_file_problem(const std::string& path, const std::string& flag,
                               const std::string& expected = "a regular file");
void require_input_file(const std::string& path, const std::string& flag,
                        const std::string& expected = "a regular file");
// The same for a folder (a Hugging Face model directory, a checkpoint).
void require_input_dir(const std::string& path, const std::string& flag, const std::string& expected = "a folder");
// An output: absent (its folder existing) or an existing regular file.
std::string output_file_problem(const std::string& path, const std::string& flag);
void require_output_file(const std::string& path, const std::string& flag);

// Whether two paths name the same file: std::filesystem::equivalent when both exist,
// their weakly_canonical forms otherwise (a file not yet written, ".." and links above it).
bool same_file(const std::string& a, const std::string& b);
// Refuses an output that is the same file as an input, or as an earlier output.
// Entries with an empty path are skipped.
void refuse_same_file(const std::vector<FlagPath>& outputs, const std::vector<FlagPath>& inputs);

}  // namespace peakbound
