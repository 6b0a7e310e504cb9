#include "peakbound/train/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/io/path_check.h"

namespace peakbound {

std::optional<double> eta_seconds(std::int64_t step, std::int64_t total_steps, double elapsed_seconds,
                                  std::int64_t first_step) {
  const std::int64_t done = step - first_step;
  if (done <= 0 || !std::isfinite(elapsed_seconds) || elapsed_seconds < 0) return std::nullopt;
  const std::int64_t left = total_steps > step ? total_steps - step : 0;
  return elapsed_seconds / static_cast<double>(done) * static_cast<double>(left);
}

std::string format_duration(std::optional<double> seconds) {
  if (!seconds || !std::isfinite(*seconds) || *seconds < 0) return "?";
  const double s = std::round(*seconds);
  if (s >= 1e9) return "?";  // beyond any run: not worth a number
  const auto t = static_cast<std::int64_t>(s);
  char buf[48];
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  return buf;
}

std::string format_rate(double v) {
  char buf[48];
  if (!std::isfinite(v)) return "?";
  if (std::fabs(v) < 999.5)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (std::fabs(v) < 999.95e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  return buf;
}

std::string progress_line(const StepReport& r, std::int64_t first_step) {
  const int width = static_cast<int>(std::to_string(r.total_steps).size());
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "step %*lld/%lld  loss %7.4f", width, static_cast<long long>(r.step),
                        static_cast<long long>(r.total_steps), r.loss);
  if (r.eval_loss) n += std::snprintf(buf + n, sizeof buf - n, "  eval %7.4f", *r.eval_loss);
  std::snprintf(buf + n, sizeof buf - n, "  lr %.1e  gnorm %6.3f  %6s tok/s  peak %10s  eta %6s", r.lr, r.grad_norm,
                format_rate(r.tokens_per_second).c_str(),
                format_bytes(static_cast<double>(r.device_peak_bytes)).c_str(),
                format_duration(eta_seconds(r.step, r.total_steps, r.elapsed_seconds, first_step)).c_str());
  return buf;
}

nlohmann::json step_json(const StepReport& r) {
  nlohmann::json j = {{"step", r.step},
                      {"total_steps", r.total_steps},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_second", r.tokens_per_second},
                      {"device_peak_bytes", r.device_peak_bytes},
                      {"elapsed_seconds", r.elapsed_seconds}};
  if (r.eval_loss) j["eval_loss"] = *r.eval_loss;
  return j;
}

Progress::Progress(std::FILE* out, bool interactive, std::int64_t first_step)
    : out_(out), interactive_(interactive), first_step_(first_step) {}

Progress::~Progress() { finish(); }

bool Progress::is_terminal(std::FILE* f) {
  const char* term = std::getenv("TERM");
  return f != nullptr && ::isatty(::fileno(f)) == 1 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

void Progress::update(const StepReport& r) {
  const std::string line = progress_line(r, first_step_);
  if (interactive_) {
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    live_ = line;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void Progress::note(const std::string& line) {
  if (interactive_ && !live_.empty())
    std::fprintf(out_, "\r%s\x1b[K\n%s\x1b[K", line.c_str(), live_.c_str());  // the note, then the live line again
  else
    std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (interactive_ && !live_.empty()) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  live_.clear();
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  // A FIFO would block the open until a reader comes, a device or folder is not a log.
  require_output_file(path, "metrics file");
  f_ = std::fopen(path.c_str(), append ? "a+" : "w");  // a+: the partial-line check reads
  if (f_ == nullptr)
    throw InvalidArgument("metrics file '" + path + "': cannot create it (" + std::strerror(errno) + ")");
  if (append) drop_partial_line();
}

// A run killed in the middle of a row leaves a partial last line: cut it, so the rows
// appended after it (a resumed run) stay one JSON object per line.
void MetricsWriter::drop_partial_line() {
  const int fd = ::fileno(f_);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size <= 0) return;
  off_t keep = size;
  char buf[4096];
  while (keep > 0) {
    const off_t from = keep > static_cast<off_t>(sizeof buf) ? keep - static_cast<off_t>(sizeof buf) : 0;
    const ssize_t n = ::pread(fd, buf, static_cast<std::size_t>(keep - from), from);
    if (n != keep - from) return;  // unreadable (a write-only file): leave it as it is
    ssize_t i = n;
    while (i > 0 && buf[i - 1] != '\n') --i;
    if (i > 0) {
      keep = from + i;
      break;
    }
    keep = from;
  }
  if (keep != size && ::ftruncate(fd, keep) != 0)
    throw InvalidArgument("metrics file '" + path_ + "': cannot cut its partial last line (" + std::strerror(errno) + ")");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& obj) {
  const std::string line = obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw InvalidArgument("metrics file '" + path_ + "': cannot write (" + std::strerror(errno) + ")");
}

}  // namespace peakbound
