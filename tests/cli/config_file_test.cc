// `--config FILE` (cli/config_file.h) in-process on a small command with the CLI's own
// flag kinds: TOML and JSON give the same values, the command line overrides the file,
// out-of-range values are refused by the flag's own check, and every bad file is one
// error naming the file (and line, for TOML).
#include "peakbound/cli/config_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/cli/flags.h"

namespace peakbound::cli {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Values {
  std::int64_t steps = 10;
  double lr = 0.001;
  std::string schedules = "none";
  std::string device_memory = "80GiB";
  bool reach = false;
  std::vector<std::string> files;
};

// A root with one command "train" carrying the flags and --config, as main.cc builds them.
struct TestCli {
  CLI::App root{"test"};
  Values v;
  CLI::App* cmd = nullptr;
  TestCli() {
    cmd = root.add_subcommand("train", "a command");
    int_flag(cmd, "--steps", v.steps, "steps", 1, 100);
    real_flag(cmd, "--lr", v.lr, "learning rate", 0.0, 1.0);
    text_flag(cmd, "--schedules", v.schedules, "schedules");
    cmd->add_option("--device-memory", v.device_memory, "memory");
    cmd->add_flag("--reach", v.reach, "a switch");
    cmd->add_option("--files", v.files, "several values");
    add_config_flag(cmd);
  }
  void parse(const std::string& args) { root.parse("train " + args, false); }
};

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pb_config_" + name;
  std::ofstream(path) << text;
  return path;
}

// The error text of parsing `args`, or "" when it parsed.
std::string error_of(const std::string& args) {
  TestCli c;
  try {
    c.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

const char* kToml = R"(# a training config
steps = 20
lr = 3e-4
schedules = "llep,dtp"   # a comma inside a string is one value
device-memory = "512MiB"
reach = true
files = ["a.bin", "b.bin"]
)";

const char* kJson = R"({"steps": 20, "lr": 3e-4, "schedules": "llep,dtp", "device-memory": "512MiB",
  "reach": true, "files": ["a.bin", "b.bin"]})";

void expect_file_values(const Values& v) {
  EXPECT_EQ(v.steps, 20);
  EXPECT_EQ(v.lr, 3e-4);
  EXPECT_EQ(v.schedules, "llep,dtp");
  EXPECT_EQ(v.device_memory, "512MiB");
  EXPECT_TRUE(v.reach);
  EXPECT_EQ(v.files, (std::vector<std::string>{"a.bin", "b.bin"}));
}

TEST(ConfigFile, TomlAndJsonGiveTheSameValues) {
  TestCli t, j, jx;
  t.parse("--config " + write("same.toml", kToml));
  expect_file_values(t.v);
  j.parse("--config " + write("same.json", kJson));
  expect_file_values(j.v);
  // JSON detected by its first character when the name does not say.
  jx.parse("--config " + write("same_json.cfg", std::string("\n  ") + kJson));
  expect_file_values(jx.v);
}

TEST(ConfigFile, KeysLeftOutKeepDefaultsAndFalseSwitchesStayOff) {
  TestCli c;
  c.parse("--config " + write("partial.toml", "steps = 7\nreach = false\n"));
  EXPECT_EQ(c.v.steps, 7);
  EXPECT_FALSE(c.v.reach);
  EXPECT_EQ(c.v.lr, 0.001);
  EXPECT_EQ(c.v.schedules, "none");
}

TEST(ConfigFile, CommandLineOverridesTheFile) {
  for (const char* name : {"over.toml", "over.json"}) {
    const std::string path = write(name, std::string(name).ends_with(".toml") ? kToml : kJson);
    TestCli before, after;
    before.parse("--steps 5 --files c.bin --config " + path);
    after.parse("--config " + path + " --steps 5 --files c.bin");
    for (const Values* v : {&before.v, &after.v}) {
      EXPECT_EQ(v->steps, 5) << name;
      EXPECT_EQ(v->files, std::vector<std::string>{"c.bin"}) << name;  // replaced, not appended
      EXPECT_EQ(v->schedules, "llep,dtp") << name;                      // the rest from the file
    }
  }
  // A value the command line overrides is never parsed: a bad one in the file is not an error.
  TestCli c;
  c.parse("--steps 3 --config " + write("over_bad.toml", "steps = 1000\n"));
  EXPECT_EQ(c.v.steps, 3);
}

TEST(ConfigFile, UnknownKeyNamesKeyAndFile) {
  const std::string t = write("unknown.toml", "steps = 2\nstepz = 3\n");
  const std::string e = error_of("--config " + t);
  EXPECT_NE(e.find("unknown key 'stepz'"), std::string::npos) << e;
  EXPECT_NE(e.find(t + ":2"), std::string::npos) << e;
  const std::string j = write("unknown.json", R"({"stepz": 3})");
  const std::string ej = error_of("--config " + j);
  EXPECT_NE(ej.find("unknown key 'stepz'"), std::string::npos) << ej;
  EXPECT_NE(ej.find(j), std::string::npos) << ej;
  // Neither dashes nor the help or config options are keys.
  EXPECT_NE(error_of("--config " + write("dashes.toml", "\"--steps\" = 2\n")).find("unknown key '--steps'"),
            std::string::npos);
  EXPECT_NE(error_of("--config " + write("help.toml", "help = true\n")).find("unknown key 'help'"), std::string::npos);
  EXPECT_NE(error_of("--config " + write("self.json", R"({"config": "x.toml"})")).find("'config' cannot be set"),
            std::string::npos);
}

TEST(ConfigFile, BadValueIsRefusedByTheFlagsOwnCheck) {
  const std::string t = write("range.toml", "lr = 0.1\nsteps = 1000\n");
  const std::string e = error_of("--config " + t);
  EXPECT_NE(e.find(t + ":2: --steps must be an integer in [1, 100]"), std::string::npos) << e;
  for (const char* json : {R"({"steps": 1000})", R"({"steps": 2.5})", R"({"steps": "many"})", R"({"steps": true})"}) {
    const std::string ej = error_of("--config " + write("range.json", json));
    EXPECT_NE(ej.find("--steps must be an integer in [1, 100]"), std::string::npos) << json << ": " << ej;
  }
  EXPECT_NE(error_of("--config " + write("nan.toml", "lr = nan\n")).find("--lr"), std::string::npos);
  EXPECT_NE(error_of("--config " + write("empty.json", R"({"schedules": ""})")).find("--schedules must not be empty"),
            std::string::npos);
  const std::string sw = error_of("--config " + write("switch.toml", "reach = maybe\n"));
  EXPECT_NE(sw.find("switch.toml:1"), std::string::npos) << sw;
  const std::string arr = error_of("--config " + write("array.toml", "steps = [1, 2]\n"));
  EXPECT_NE(arr.find("'steps' takes one value (got 2)"), std::string::npos) << arr;
}

TEST(ConfigFile, MissingOrMalformedFileIsOneLineNamingIt) {
  auto one_line_naming = [](const std::string& e, const std::string& needle) {
    EXPECT_NE(e.find(needle), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  const std::string missing = ::testing::TempDir() + "/pb_config_no_such_file.toml";
  one_line_naming(error_of("--config " + missing), missing + ": cannot read");
  {
    TestCli c;  // --help wins over a bad file
    EXPECT_THROW(c.parse("--config " + missing + " --help"), CLI::CallForHelp);
  }
  {
    TestCli c;  // an empty argument, as a shell passes '' (a parse of one string would drop it)
    std::vector<std::string> reversed_args = {"", "--config", "train"};
    try {
      c.root.parse(reversed_args);
      ADD_FAILURE() << "an empty --config parsed";
    } catch (const CLI::ParseError& e) {
      one_line_naming(e.what(), "--config must not be empty");
    }
  }
  // TOML is read by toml++: its message, after the file and the line it names.
  const std::string noeq = write("noeq.toml", "steps = 2\n\nsteps 3\n");
  one_line_naming(error_of("--config " + noeq), noeq + ":3: malformed TOML: ");
  const std::string twice = write("twice.toml", "steps = 2\nsteps = 3\n");
  one_line_naming(error_of("--config " + twice), twice + ":2: malformed TOML: ");
  one_line_naming(error_of("--config " + twice), "'steps'");
  const std::string unterminated = write("unterminated.toml", "files = [\"a\",\n  \"b\"\n");
  one_line_naming(error_of("--config " + unterminated), unterminated + ":2: malformed TOML: ");
  const std::string quote = write("quote.toml", "schedules = \"all\n");
  one_line_naming(error_of("--config " + quote), quote + ":1: malformed TOML: ");
  {
    TestCli c;  // '#' inside a string is part of the string, not a comment
    c.parse("--config " + write("hash.toml", "schedules = \"a#b\"  # a comment\n"));
    EXPECT_EQ(c.v.schedules, "a#b");
  }
  const std::string json = write("bad.json", "{\"steps\": 2,\n \"lr\": }\n");
  one_line_naming(error_of("--config " + json), json + ": malformed JSON: parse error at line 2");
  const std::string dup = write("dup.json", R"({"steps": 2, "lr": 0.1, "steps": 3})");
  one_line_naming(error_of("--config " + dup), dup + ": 'steps' given twice");
  const std::string list = write("list.json", "[1, 2]");
  one_line_naming(error_of("--config " + list), list + ": a JSON config file must be one object");
  // Found by tests/fuzz: a number past double's range leaked nlohmann's out_of_range (not a
  // ConfigError); a key holding a newline split the error; a vertical tab before '=' is
  // not TOML.
  const std::string big = write("big.json", R"({"lr": 6e7111111})");
  one_line_naming(error_of("--config " + big), big + ": malformed JSON: number overflow parsing '6e7111111'");
  const std::string newline = write("newline.json", R"({"st\neps": 1})");
  one_line_naming(error_of("--config " + newline), newline + ": unknown key 'st\\neps'");
  const std::string vtab = write("vtab.toml", "\v= 1\n");
  one_line_naming(error_of("--config " + vtab), vtab + ":1: malformed TOML: ");
  // A config file is refused past 64 KiB, read no further; /dev/zero (which never ends) is
  // not a regular file and is not opened.
  std::string big_array = "files = [";
  while (big_array.size() < (64 << 10)) big_array += "\"a\",";
  const std::string large = write("large.toml", big_array + "\"b\"]\n");
  one_line_naming(error_of("--config " + large), large + ": larger than 64 KiB");
  one_line_naming(error_of("--config /dev/zero"), "--config /dev/zero is not a regular file (a character device)");
}

TEST(ConfigFile, NestedTablesAndObjectsAreRefused) {
  const std::string table = write("table.toml", "steps = 2\n[train]\nsteps = 3\n");
  EXPECT_NE(error_of("--config " + table).find(table + ":2: tables ([train]) are not taken"), std::string::npos);
  const std::string dotted = write("dotted.toml", "train.steps = 3\n");
  EXPECT_NE(error_of("--config " + dotted).find(dotted + ":1: dotted key 'train.steps'"), std::string::npos);
  const std::string inl = write("inline.toml", "model = { layers = 2 }\n");
  EXPECT_NE(error_of("--config " + inl).find(inl + ":1: 'model' is an inline table"), std::string::npos);
  const std::string obj = write("nested.json", R"({"train": {"steps": 3}})");
  EXPECT_NE(error_of("--config " + obj).find(obj + ": 'train' is an object: nested objects are not taken"),
            std::string::npos);
  const std::string deep = write("deep.json", R"({"files": [["a"]]})");
  EXPECT_NE(error_of("--config " + deep).find("'files' holds an array inside an array"), std::string::npos);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cli
