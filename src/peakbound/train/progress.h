// Training progress for people and for programs. Progress prints one line per report:
//   step  12/200  loss 5.1234  lr 3.0e-04  gnorm 1.234  12.3k tok/s  peak 1.21 GiB  eta 1m05s
// (plus "eval 5.0000" when the report has an eval loss). Interactive (a terminal) it
// is one line refreshed in place ("\r", the text, then "\x1b[K" to clear what a longer
// earlier line left), its fields padded to fixed widths so they do not jump; otherwise
// one plain line per update (the caller decides how often). note() prints a whole line
// above the refreshing one without breaking it.
//
// ETA is the mean step time so far times the steps left:
//   eta = elapsed / (step - first_step) * (total_steps - step),
// where first_step is the step the run started from (0, or the step a resumed run
// begins after) and elapsed the wall time since the run started.
//
// MetricsWriter appends machine-readable rows: one JSON object per line (JSONL),
// flushed after each, so a crashed run keeps every row written before it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace peakbound {

struct StepReport {
  std::int64_t step = 0;         // steps done (the one just finished), 1-based
  std::int64_t total_steps = 0;  // steps the run will do in all
  double loss = 0;
  double tokens_per_second = 0;
  std::uint64_t device_peak_bytes = 0;
  double elapsed_seconds = 0;  // wall time since the run started
  std::optional<double> eval_loss;
  double lr = 0;
  double grad_norm = 0;
};

// Seconds left at the mean step time so far; nullopt before the first step of the run.
std::optional<double> eta_seconds(std::int64_t step, std::int64_t total_steps, double elapsed_seconds,
                                  std::int64_t first_step = 0);
// "45s", "1m05s", "2h03m"; "?" for nullopt or a non-finite or negative time.
std::string format_duration(std::optional<double> seconds);
// "950", "12.3k", "1.25M" (tokens per second and such).
std::string format_rate(double per_second);
// One progress line without "\r" or "\n", fields padded to fixed widths.
std::string progress_line(const StepReport& r, std::int64_t first_step = 0);
// The row MetricsWriter writes for a step: every field of `r` (eval_loss only when set).
nlohmann::json step_json(const StepReport& r);

class Progress {
 public:
  // `out` is written (not owned). `first_step`: steps already done when the run began.
  Progress(std::FILE* out, bool interactive, std::int64_t first_step = 0);
  // Whether `f` is a terminal that takes "\r" and "\x1b[K" (a tty, TERM not "dumb"): the
  // usual choice of `interactive`.
  static bool is_terminal(std::FILE* f);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(const StepReport& r);
  void note(const std::string& line);
  // Ends the refreshing line (a newline after it); later output starts on a fresh line.
  void finish();

 private:
  std::FILE* out_;
  bool interactive_;
  std::int64_t first_step_;
  std::string live_;  // the refreshing line on screen now ("" when none)
};

class MetricsWriter {
 public:
  // Creates (or truncates; with append, extends) the file. Throws InvalidArgument, one
  // line naming the path and the system's reason, when it cannot. Appending drops a
  // partial last line (a run killed mid-row), so every line stays one JSON object.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // One line: the object's compact JSON (NaN and infinities become null, invalid UTF-8
  // is replaced), then flushed. Throws InvalidArgument naming the path if writing fails.
  void write(const nlohmann::json& obj);
  const std::string& path() const { return path_; }

 private:
  void drop_partial_line();

  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace peakbound
