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

// An llm.c-style header whatever its magic: at least 1024 bytes, a small version (1 to
// 255) in the second int32, and either int32s 4..255 all zero (llm.c writes its headers
// from np.zeros: the data files use words 0..2, the tokenizer file 0..3) or a token count
// that matches the file's size for 2- or 4-byte tokens. Every header llm.c's writers make
// has this shape, so a file with a wrong magic is refused by name, never read as flat
// tokens (its header would become 512 tokens). A flat token file has this shape only if
// tokens 2..3 (uint16) encode a version of 1..255 and then either 504 zero tokens follow
// or tokens 4..5 encode the file's own token count exactly: such a file is refused,
// never misread.
bool looks_like_header(const std::int32_t* head, std::uint64_t size) {
  if (size < static_cast<std::uint64_t>(TokenFile::kHeaderInts) * 4) return false;
  if (head[1] < 1 || head[1] > 255) return false;
  bool zeros = true;
  for (std::int64_t i = 4; i < TokenFile::kHeaderInts && zeros; ++i) zeros = head[i] == 0;
  if (zeros) return true;
  if (head[2] < 0) return false;
  const std::uint64_t body = size - static_cast<std::uint64_t>(TokenFile::kHeaderInts) * 4;
  const auto n = static_cast<std::uint64_t>(head[2]);
  return body == 2 * n || body == 4 * n;
}
}  // namespace

TokenFile TokenFile::open(const std::string& path, int flat_token_bytes) {
  if (flat_token_bytes != 2 && flat_token_bytes != 4)
    throw InvalidArgument("token bytes must be 2 or 4 (got " + std::to_string(flat_token_bytes) + ")");
  TokenFile f;
  f.path_ = path;
  f.file_ = MappedFile::open(path);
  const std::uint64_t size = f.file_.size();
  const auto* base = reinterpret_cast<const unsigned char*>(f.file_.data());
  std::int32_t head[kHeaderInts] = {};
  if (size > 0) std::memcpy(head, base, std::min<std::uint64_t>(size, sizeof head));  // empty: no mapping
  const bool known_magic = size >= 4 && (head[0] == kMagicU16 || head[0] == kMagicU32);
  if (known_magic && size < kHeaderInts * 4)
    bad(path, "starts with llm.c's magic " + std::to_string(head[0]) + " but is " + std::to_string(size) +
                  " bytes, shorter than its 1024-byte header (a truncated file?)");
  if (!known_magic && looks_like_header(head, size))
    bad(path, "its first 1024 bytes are shaped like an llm.c header (version " + std::to_string(head[1]) + ", " +
                  std::to_string(head[2]) + " tokens) but its magic is " + std::to_string(head[0]) +
                  ", not 20240520 (uint16 tokens) or 20240801 (uint32); it is not read as flat tokens (llm.c's "
                  "tokenizer files have magic 20240328: pass the tokenized .bin, not the tokenizer)");
  if (known_magic) {
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
