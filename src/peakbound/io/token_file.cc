#include "peakbound/io/token_file.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/mapped_file.h"

namespace peakbound {

namespace {
[[noreturn]] void bad(const std::string& path, const std::string& what) { throw InvalidArgument(path + ": " + what); }
}  // namespace

TokenFile TokenFile::open(const std::string& path, int flat_token_bytes) {
  if (flat_token_bytes != 2 && flat_token_bytes != 4)
    throw InvalidArgument("token bytes must be 2 or 4 (got " + std::to_string(flat_token_bytes) + ")");
  TokenFile f;
  f.path_ = path;
  f.file_ = MappedFile::open(path);
  const std::uint64_t size = f.file_.size();
  const auto* base = reinterpret_cast<const unsigned char*>(f.file_.data());
  std::int32_t head[3] = {0, 0, 0};
  if (size >= kHeaderInts * 4) std::memcpy(head, base, sizeof head);
  if (head[0] == kMagicU16 || head[0] == kMagicU32) {
    f.header_ = true;
    f.width_ = head[0] == kMagicU16 ? 2 : 4;
    if (head[1] != 1) bad(path, "llm.c header version " + std::to_string(head[1]) + " (this reader knows version 1)");
    if (head[2] < 0) bad(path, "llm.c header says " + std::to_string(head[2]) + " tokens");
    f.count_ = head[2];
    const std::uint64_t want = kHeaderInts * 4 + static_cast<std::uint64_t>(f.count_) * static_cast<std::uint64_t>(f.width_);
    if (size != want)
      bad(path, "llm.c header says " + std::to_string(f.count_) + " tokens of " + std::to_string(f.width_) +
                    " bytes, but the file has " + std::to_string(size) + " bytes (expected " + std::to_string(want) + ")");
    f.data_ = base + kHeaderInts * 4;
  } else {
    f.width_ = flat_token_bytes;
    if (size % static_cast<std::uint64_t>(f.width_) != 0)
      bad(path, std::to_string(size) + " bytes is not a whole number of " + std::to_string(f.width_) +
                    "-byte tokens (and there is no llm.c header)");
    f.count_ = static_cast<std::int64_t>(size / static_cast<std::uint64_t>(f.width_));
    f.data_ = base;
  }
  if (f.count_ == 0) bad(path, "holds no tokens");
  return f;
}

std::uint32_t TokenFile::at(std::int64_t i) const {
  PB_CHECK_MSG(i >= 0 && i < count_, "token index out of range");
  if (width_ == 2) {
    std::uint16_t v;
    std::memcpy(&v, data_ + 2 * i, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, data_ + 4 * i, 4);
  return v;
}

void TokenFile::read(std::int64_t begin, std::int64_t n, std::int32_t* out) const {
  if (begin < 0 || n < 0 || begin > count_ - n)
    bad(path_, "tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) + ") lie past its " +
                   std::to_string(count_) + " tokens");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t t = at(begin + i);
    if (t > static_cast<std::uint32_t>(INT32_MAX)) bad(path_, "token " + std::to_string(t) + " does not fit an int32 id");
    out[i] = static_cast<std::int32_t>(t);
  }
}

std::int64_t TokenFile::windows(std::int64_t begin, std::int64_t end, std::int64_t S) {
  if (S < 1 || end - begin < S + 1) return 0;
  return (end - begin - 1) / S;
}

void TokenFile::window(std::int64_t begin, std::int64_t end, std::int64_t S, std::int64_t i, std::int32_t* inputs,
                       std::int32_t* targets) const {
  if (i < 0 || i >= windows(begin, end, S))
    bad(path_, "window " + std::to_string(i) + " of " + std::to_string(S) + " tokens is past the " +
                   std::to_string(windows(begin, end, S)) + " windows of tokens [" + std::to_string(begin) + ", " +
                   std::to_string(end) + ")");
  std::vector<std::int32_t> buf(static_cast<std::size_t>(S + 1));
  read(begin + i * S, S + 1, buf.data());
  std::copy(buf.begin(), buf.end() - 1, inputs);
  std::copy(buf.begin() + 1, buf.end(), targets);
}

TokenFile::Split TokenFile::split(double fraction, std::int64_t S) const {
  if (!(fraction >= 0.0 && fraction < 1.0)) throw InvalidArgument("held-out fraction must be in [0, 1)");
  Split s;
  std::int64_t held = static_cast<std::int64_t>(std::ceil(fraction * static_cast<double>(count_)));
  if (fraction > 0 && held < S + 1 && count_ >= 2 * (S + 1)) held = S + 1;
  s.train_end = count_ - held;
  s.eval_begin = s.train_end;
  return s;
}

void write_token_file(const std::string& path, const std::int32_t* tokens, std::int64_t n) {
  if (n < 0 || n > INT32_MAX) throw InvalidArgument(path + ": an llm.c header holds at most 2^31 - 1 tokens");
  bool fits16 = true;
  for (std::int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) throw InvalidArgument(path + ": token " + std::to_string(tokens[i]) + " is negative");
    fits16 = fits16 && tokens[i] <= 0xffff;
  }
  std::vector<std::int32_t> head(TokenFile::kHeaderInts, 0);
  head[0] = fits16 ? TokenFile::kMagicU16 : TokenFile::kMagicU32;
  head[1] = 1;
  head[2] = static_cast<std::int32_t>(n);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InvalidArgument(path + ": cannot write: " + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size() * 4));
  for (std::int64_t i = 0; i < n; ++i) {
    if (fits16) {
      const auto v = static_cast<std::uint16_t>(tokens[i]);
      out.write(reinterpret_cast<const char*>(&v), 2);
    } else {
      const auto v = static_cast<std::uint32_t>(tokens[i]);
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  if (!out) throw InvalidArgument(path + ": write failed");
}

}  // namespace peakbound
