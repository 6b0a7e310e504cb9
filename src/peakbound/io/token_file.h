// TokenFile: a tokenized corpus in the nanoGPT / llm.c convention, mapped read-only.
// With llm.c's header (256 int32: magic 20240520 for uint16 tokens or 20240801 for
// uint32, version 1, token count) the token width and count come from it; without one
// the file is flat tokens of `flat_token_bytes` (2 as nanoGPT writes them, or 4). A file
// whose first KiB is shaped like an llm.c header (a small version, then zeros or a count
// that matches the size) but whose magic is another is refused, never read flat; so is
// a known magic in a file shorter than the header.
// Windows follow llm.c's loader: window i reads tokens [i S, i S + S] (S + 1 tokens),
// inputs the first S, targets the last S, so consecutive windows advance by S.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "peakbound/io/mapped_file.h"

namespace peakbound {

class TokenFile {
 public:
  static constexpr std::int32_t kMagicU16 = 20240520;
  static constexpr std::int32_t kMagicU32 = 20240801;
  static constexpr std::int64_t kHeaderInts = 256;

  // Throws InvalidArgument naming the file: unreadable, a header that disagrees with the
  // file's size or has an unknown magic, a flat file whose size is not a whole number of
  // tokens, no tokens.
  static TokenFile open(const std::string& path, int flat_token_bytes = 2);

  const std::string& path() const { return path_; }
  std::int64_t tokens() const { return count_; }
  int token_bytes() const { return width_; }
  bool has_header() const { return header_; }
  std::uint32_t at(std::int64_t i) const;  // throws InternalError out of range
  // Copies tokens [begin, begin + n) into out; throws InvalidArgument past the end.
  void read(std::int64_t begin, std::int64_t n, std::int32_t* out) const;

  // Windows of S inputs (and S targets) that fit in tokens [begin, end).
  static std::int64_t windows(std::int64_t begin, std::int64_t end, std::int64_t S);
  // Window i of [begin, end): inputs [S] and targets [S] (the inputs shifted by one).
  void window(std::int64_t begin, std::int64_t end, std::int64_t S, std::int64_t i, std::int32_t* inputs,
              std::int32_t* targets) const;

  // The held-out split: the last `fraction` of the tokens (at least one window of S
  // when the file has two); the training split is everything before it.
  struct Split {
    std::int64_t train_end = 0, eval_begin = 0;
  };
  Split split(double fraction, std::int64_t S) const;

 private:
  std::string path_;
  MappedFile file_;
  const unsigned char* data_ = nullptr;
  std::int64_t count_ = 0;
  int width_ = 2;
  bool header_ = false;
};

// Writes tokens with llm.c's header (uint16 when every token fits, else uint32).
void write_token_file(const std::string& path, const std::int32_t* tokens, std::int64_t n);

}  // namespace peakbound
