#include "peakbound/io/path_check.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

namespace fs = std::filesystem;

std::string who(const std::string& flag, const std::string& path) {
  return flag.empty() ? "'" + path + "'" : flag + " '" + path + "'";
}

// "a FIFO", "a character device", ...: what a non-regular file is, in words.
std::string kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

std::string kind_phrase(mode_t m) {
  const std::string k = kind(m);
  return k.rfind("not ", 0) == 0 ? k : "is " + k;
}

// stat(2) following links; errno on failure.
int stat_of(const std::string& path, struct stat& sb) { return ::stat(path.c_str(), &sb) == 0 ? 0 : errno; }

std::string input_problem(const std::string& path, const std::string& flag, const std::string& expected,
                          bool want_dir) {
  if (path.empty()) return (flag.empty() ? std::string("a path") : flag) + " is empty: give " + expected;
  struct stat sb {};
  if (const int err = stat_of(path, sb); err != 0)
    return who(flag, path) + ": cannot read: " + std::strerror(err);
  if (want_dir) {
    if (S_ISDIR(sb.st_mode)) return "";
    return who(flag, path) + " " + (S_ISREG(sb.st_mode) ? std::string("is a file") : kind_phrase(sb.st_mode)) +
           ", expected " + expected;
  }
  if (S_ISREG(sb.st_mode)) return "";
  if (S_ISDIR(sb.st_mode)) return who(flag, path) + " is a directory, expected " + expected;
  return who(flag, path) + " " + kind_phrase(sb.st_mode) + ", expected " + expected +
         " (a FIFO, device or socket is not read: it can block, or never end)";
}

}  // namespace

std::string input_file_problem(const std::string& path, const std::string& flag, const std::string& expected) {
  return input_problem(path, flag, expected, false);
}

void require_input_file(const std::string& path, const std::string& flag, const std::string& expected) {
  if (std::string why = input_problem(path, flag, expected, false); !why.empty()) throw InvalidArgument(why);
}

void require_input_dir(const std::string& path, const std::string& flag, const std::string& expected) {
  if (std::string why = input_problem(path, flag, expected, true); !why.empty()) throw InvalidArgument(why);
}

std::string output_file_problem(const std::string& path, const std::string& flag) {
  if (path.empty()) return (flag.empty() ? std::string("an output path") : flag) + " is empty: give a file to write";
  struct stat sb {};
  const int err = stat_of(path, sb);
  if (err == 0) {
    if (S_ISREG(sb.st_mode)) return "";
    if (S_ISDIR(sb.st_mode)) return who(flag, path) + " is a directory: give the path of a file to write";
    return who(flag, path) + " " + kind_phrase(sb.st_mode) +
           ": an output must be a regular file or a path that does not exist yet (a FIFO, device or socket is "
           "never written)";
  }
  if (err != ENOENT) return who(flag, path) + ": " + std::strerror(err);
  // Absent: its folder must exist (else the run would fail at its first write, or at its end).
  const fs::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  struct stat db {};
  if (const int derr = stat_of(dir, db); derr != 0)
    return who(flag, path) + ": cannot create it: the folder '" + dir + "' " +
           (derr == ENOENT ? std::string("does not exist") : "cannot be read") + " (" + std::strerror(derr) + ")";
  if (!S_ISDIR(db.st_mode)) return who(flag, path) + ": cannot create it: '" + dir + "' is not a folder";
  return "";
}

void require_output_file(const std::string& path, const std::string& flag) {
  if (std::string why = output_file_problem(path, flag); !why.empty()) throw InvalidArgument(why);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) {
    std::error_code ec;
    const bool same = fs::equivalent(a, b, ec);
    if (!ec) return same;
  }
  std::error_code ca, cb;
  fs::path x = fs::weakly_canonical(a, ca), y = fs::weakly_canonical(b, cb);
  if (ca) x = fs::absolute(a, ca).lexically_normal();
  if (cb) y = fs::absolute(b, cb).lexically_normal();
  return x == y;
}

void refuse_same_file(const std::vector<FlagPath>& outputs, const std::vector<FlagPath>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const FlagPath& o = outputs[i];
    if (o.path.empty()) continue;
    for (const FlagPath& in : inputs)
      if (!in.path.empty() && same_file(o.path, in.path))
        throw InvalidArgument(who(o.flag, o.path) + " is the same file as " + who(in.flag, in.path) +
                              ": writing it would destroy that input; give another path");
    for (std::size_t k = 0; k < i; ++k)
      if (!outputs[k].path.empty() && same_file(o.path, outputs[k].path))
        throw InvalidArgument(who(o.flag, o.path) + " is the same file as " + who(outputs[k].flag, outputs[k].path) +
                              ": each output needs a file of its own");
  }
}

}  // namespace peakbound
