// io/path_check.h: inputs must be regular files (or folders), outputs absent or regular
// files, and no output the same file as an input or another output, however spelled;
// io/atomic_file.h refuses to rename over a file that is not a regular one.
#include "peakbound/io/path_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/io/atomic_file.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;

struct Dir {
  std::string path;
  explicit Dir(const std::string& name)
      : path(::testing::TempDir() + "/pb_paths_" + name + "_" + std::to_string(::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path + "/sub");
    std::ofstream(path + "/file") << "data";
    ::mkfifo((path + "/fifo").c_str(), 0600);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// The message of the InvalidArgument `f` throws ("" when it throws none).
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(PathCheck, InputsMustBeRegularFiles) {
  Dir d("in");
  EXPECT_EQ(refusal([&] { require_input_file(d / "file", "--data"); }), "");
  EXPECT_EQ(refusal([&] { require_input_file(d / "fifo", "--data", "a token file"); }),
            "--data '" + (d / "fifo") +
                "' is a FIFO, expected a token file (a FIFO, device or socket is not read: it can block, or never end)");
  EXPECT_EQ(refusal([&] { require_input_file(d / "sub", "plot-memory", "the JSON"); }),
            "plot-memory '" + (d / "sub") + "' is a directory, expected the JSON");
  EXPECT_NE(refusal([&] { require_input_file("/dev/null", "--data"); }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(refusal([&] { require_input_file(d / "missing", "--data"); }).find("cannot read: No such file or directory"),
            std::string::npos);
  EXPECT_EQ(refusal([&] { require_input_dir(d / "sub", "--hf"); }), "");
  EXPECT_NE(refusal([&] { require_input_dir(d / "file", "--hf"); }).find("is a file, expected a folder"),
            std::string::npos);
  EXPECT_NE(input_file_problem(d / "fifo", "--config").find("is a FIFO"), std::string::npos);
}

TEST(PathCheck, OutputsAreAbsentOrRegularFiles) {
  Dir d("out");
  EXPECT_EQ(refusal([&] { require_output_file(d / "file", "--metrics"); }), "");
  EXPECT_EQ(refusal([&] { require_output_file(d / "new.jsonl", "--metrics"); }), "");
  EXPECT_EQ(refusal([&] { require_output_file(d / "sub/new.jsonl", "--metrics"); }), "");
  EXPECT_NE(refusal([&] { require_output_file(d / "fifo", "--metrics"); }).find("'" + (d / "fifo") + "' is a FIFO: "),
            std::string::npos);
  EXPECT_NE(refusal([&] { require_output_file("/dev/null", "--memory-timeline"); }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(refusal([&] { require_output_file(d / "sub", "--metrics"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(refusal([&] { require_output_file(d / "nowhere/m.jsonl", "--metrics"); })
                .find("the folder '" + (d / "nowhere") + "' does not exist"),
            std::string::npos);
  EXPECT_NE(refusal([&] { require_output_file(d / "file/m.jsonl", "--metrics"); }), "");
}

TEST(PathCheck, SameFileHoweverSpelled) {
  Dir d("same");
  fs::create_symlink(d / "file", d / "link");
  fs::create_hard_link(d / "file", d / "hard");
  EXPECT_TRUE(same_file(d / "file", d / "file"));
  EXPECT_TRUE(same_file(d / "file", d / "./sub/../file"));
  EXPECT_TRUE(same_file(d / "file", d / "link"));
  EXPECT_TRUE(same_file(d / "file", d / "hard"));
  EXPECT_FALSE(same_file(d / "file", d / "fifo"));
  // Not written yet: the same path however spelled, through a link above it too.
  fs::create_directory_symlink(d / "sub", d / "sublink");
  EXPECT_TRUE(same_file(d / "sub/new.json", d / "sublink/new.json"));
  EXPECT_TRUE(same_file(d / "new.json", d / "sub/../new.json"));
  EXPECT_FALSE(same_file(d / "new.json", d / "sub/new.json"));
}

TEST(PathCheck, RefusesAnOutputOverAnInputOrAnotherOutput) {
  Dir d("refuse");
  fs::create_symlink(d / "file", d / "link");
  const std::vector<FlagPath> inputs = {{"--data", d / "file"}, {"--config", ""}};
  EXPECT_EQ(refusal([&] { refuse_same_file({{"--metrics", d / "m.jsonl"}, {"--memory-timeline", ""}}, inputs); }), "");
  EXPECT_EQ(refusal([&] { refuse_same_file({{"--metrics", d / "link"}}, inputs); }),
            "--metrics '" + (d / "link") + "' is the same file as --data '" + (d / "file") +
                "': writing it would destroy that input; give another path");
  EXPECT_EQ(refusal([&] { refuse_same_file({{"--metrics", d / "t.json"}, {"--memory-timeline", d / "sub/../t.json"}}, inputs); }),
            "--memory-timeline '" + (d / "sub/../t.json") + "' is the same file as --metrics '" + (d / "t.json") +
                "': each output needs a file of its own");
}

TEST(AtomicFile, RefusesToReplaceAFileThatIsNotRegular) {
  Dir d("atomic");
  for (const std::string& target : {d / "fifo", d / "sub"}) {
    try {
      write_text_atomic(target, "x");
      ADD_FAILURE() << target << " was replaced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(target + ": is a"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not replaced"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));  // still the FIFO, not a regular file
  EXPECT_TRUE(fs::is_directory(d / "sub"));
  for (const fs::directory_entry& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();  // nothing left behind
  write_text_atomic(d / "file", "new");  // a regular file is still replaced
  std::ifstream in(d / "file");
  std::string s;
  in >> s;
  EXPECT_EQ(s, "new");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
