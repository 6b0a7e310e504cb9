// Progress lines (both modes, captured with open_memstream), the ETA arithmetic, and the
// metrics JSONL file.
#include "peakbound/train/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// Everything written to a FILE* by `f`.
template <typename F>
std::string captured(F&& f) {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  f(out);
  std::fclose(out);
  std::string s(buf, size);
  std::free(buf);
  return s;
}

StepReport report(std::int64_t step) {
  StepReport r;
  r.step = step;
  r.total_steps = 200;
  r.loss = 5.12341;
  r.lr = 3e-4;
  r.grad_norm = 1.25;
  r.tokens_per_second = 12345;
  r.device_peak_bytes = 1300000000;  // 1.21 GiB
  r.elapsed_seconds = 3.9 * static_cast<double>(step);
  return r;
}

TEST(Progress, EtaIsMeanStepTimeTimesStepsLeft) {
  EXPECT_DOUBLE_EQ(*eta_seconds(12, 200, 24.0, 0), 24.0 / 12 * 188);
  EXPECT_DOUBLE_EQ(*eta_seconds(110, 200, 5.0, 100), 5.0 / 10 * 90);  // resumed at step 100
  EXPECT_DOUBLE_EQ(*eta_seconds(200, 200, 99.0), 0.0);
  EXPECT_FALSE(eta_seconds(100, 200, 5.0, 100));  // no step of this run yet
  EXPECT_FALSE(eta_seconds(0, 200, 0.0));
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(std::nullopt), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(format_rate(950), "950");
  EXPECT_EQ(format_rate(12345), "12.3k");
  EXPECT_EQ(format_rate(1254000), "1.25M");
}

TEST(Progress, PlainModeIsOneLinePerUpdate) {
  const std::string s = captured([](std::FILE* out) {
    Progress p(out, false);
    p.update(report(12));
    p.note("checkpoint saved");
    StepReport r = report(13);
    r.eval_loss = 5.0;
    p.update(r);
    p.finish();
  });
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(s.find('\x1b'), std::string::npos);
  // 3.9 s a step, 188 steps left: 733.2 s.
  EXPECT_EQ(s,
            "step  12/200  loss  5.1234  lr 3.0e-04  gnorm  1.250   12.3k tok/s  peak   1.21 GiB  eta 12m13s\n"
            "checkpoint saved\n"
            "step  13/200  loss  5.1234  eval  5.0000  lr 3.0e-04  gnorm  1.250   12.3k tok/s  peak   1.21 GiB  eta "
            "12m09s\n");
}

TEST(Progress, InteractiveModeRefreshesOneLineAndNotesGoAboveIt) {
  const std::string s = captured([](std::FILE* out) {
    Progress p(out, true);
    p.note("starting");  // before any progress line: a plain line
    p.update(report(1));
    p.update(report(2));
    p.note("eval 4.9");
    p.update(report(3));
    p.finish();
    p.finish();  // a second finish adds nothing
  });
  const std::string l1 = progress_line(report(1)), l2 = progress_line(report(2)), l3 = progress_line(report(3));
  EXPECT_EQ(s, "starting\n\r" + l1 + "\x1b[K\r" + l2 + "\x1b[K\reval 4.9\x1b[K\n" + l2 + "\x1b[K\r" + l3 + "\x1b[K\n");
  // Fixed widths: the line does not change length as the numbers do.
  StepReport big = report(150);
  big.tokens_per_second = 2.5e6;
  big.loss = 10.5;
  EXPECT_EQ(progress_line(big).size(), l1.size()) << progress_line(big) << "\n" << l1;
  // A memory stream or a file is never a terminal.
  std::FILE* f = std::tmpfile();
  EXPECT_FALSE(Progress::is_terminal(f));
  std::fclose(f);
}

TEST(MetricsWriter, EveryLineIsOneJsonObject) {
  const std::string path = ::testing::TempDir() + "/pb_metrics_test.jsonl";
  {
    MetricsWriter w(path);
    StepReport r = report(1);
    w.write(step_json(r));
    r.eval_loss = 4.5;
    w.write(step_json(r));
    w.write({{"event", "done"}, {"nan", std::numeric_limits<double>::quiet_NaN()}, {"text", "two\nlines"}});
    // Flushed after each write: readable before the writer closes.
    std::ifstream f(path);
    int lines = 0;
    for (std::string l; std::getline(f, l);) ++lines;
    EXPECT_EQ(lines, 3);
  }
  std::ifstream f(path);
  std::vector<nlohmann::json> rows;
  for (std::string l; std::getline(f, l);) rows.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["step"], 1);
  EXPECT_EQ(rows[0]["device_peak_bytes"], 1300000000u);
  EXPECT_DOUBLE_EQ(rows[0]["loss"].get<double>(), 5.12341);
  EXPECT_FALSE(rows[0].contains("eval_loss"));
  EXPECT_DOUBLE_EQ(rows[1]["eval_loss"].get<double>(), 4.5);
  EXPECT_TRUE(rows[2]["nan"].is_null());
  EXPECT_EQ(rows[2]["text"], "two\nlines");
  {
    MetricsWriter again(path, /*append=*/true);
    again.write({{"step", 2}});
  }
  std::ifstream g(path);
  int lines = 0;
  for (std::string l; std::getline(g, l);) ++lines;
  EXPECT_EQ(lines, 4);
}

// Appending (a resumed run) cuts a partial last row left by a killed run, so every line
// stays one JSON object; without append the file starts anew.
TEST(MetricsWriter, AppendCutsAPartialLastRow) {
  const auto file_text = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string path = ::testing::TempDir() + "/pb_metrics_partial.jsonl";
  {
    std::ofstream f(path);
    f << "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"lo";
  }
  {
    MetricsWriter w(path, /*append=*/true);
    w.write({{"step", 3}});
  }
  std::vector<nlohmann::json> rows;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) {
    ASSERT_TRUE(nlohmann::json::accept(l)) << l;
    rows.push_back(nlohmann::json::parse(l));
  }
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2]["step"], 3);
  {
    // A file of one partial line: nothing of it kept.
    std::ofstream g(path);
    g << "{\"st";
  }
  { MetricsWriter w(path, /*append=*/true); w.write({{"step", 1}}); }
  EXPECT_EQ(file_text(path), "{\"step\":1}\n");
  { MetricsWriter w(path); }
  EXPECT_EQ(file_text(path), "");
}

TEST(MetricsWriter, UnwritablePathIsOneLineNamingIt) {
  const std::string path = ::testing::TempDir() + "/pb_no_such_dir/metrics.jsonl";
  try {
    MetricsWriter w(path);
    FAIL() << "created " << path;
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
