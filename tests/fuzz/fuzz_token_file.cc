// Fuzz target: the token-file reader (io/token_file.h), llm.c header or flat tokens. The
// first byte chooses the flat token width (2 or 4) and the sequence length S and held-out
// fraction the reader is then used with; the rest is the file. On success the token count
// and width agree with the file's size, every token, window and split reads within it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "peakbound/io/token_file.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int flat_bytes = (data[0] & 1) ? 4 : 2;
  const std::int64_t S = 1 + ((data[0] >> 1) & 15);      // 1..16
  const double fraction = ((data[0] >> 5) & 7) / 16.0;    // 0..7/16
  const fuzz::MemFile mem(data + 1, size - 1);
  const std::uint64_t file_size = size - 1;
  fuzz::expect_ours([&] {
    const TokenFile f = TokenFile::open(mem.path(), flat_bytes);
    FUZZ_CHECK(f.tokens() > 0);
    FUZZ_CHECK(f.token_bytes() == 2 || f.token_bytes() == 4);
    const std::uint64_t body = static_cast<std::uint64_t>(f.tokens()) * static_cast<std::uint64_t>(f.token_bytes());
    FUZZ_CHECK(body + (f.has_header() ? TokenFile::kHeaderInts * 4 : 0) == file_size);
    if (!f.has_header()) FUZZ_CHECK(f.token_bytes() == flat_bytes);
    std::uint32_t sum = 0;
    for (std::int64_t i = 0; i < f.tokens(); ++i) sum += f.at(i);
    (void)sum;
    const TokenFile::Split s = f.split(fraction, S);
    FUZZ_CHECK(0 <= s.train_end && s.train_end <= s.eval_begin && s.eval_begin <= f.tokens());
    const std::int64_t n = TokenFile::windows(0, f.tokens(), S);
    FUZZ_CHECK(n >= 0 && n * S + (n > 0 ? 1 : 0) <= f.tokens());
    std::vector<std::int32_t> in(static_cast<std::size_t>(S)), out(static_cast<std::size_t>(S));
    for (std::int64_t i : {std::int64_t{0}, n - 1}) {
      if (i < 0 || i >= n) continue;
      f.window(0, f.tokens(), S, i, in.data(), out.data());  // may refuse a token past int32
      FUZZ_CHECK(std::equal(in.begin() + 1, in.end(), out.begin()));
    }
    std::vector<std::int32_t> all(static_cast<std::size_t>(f.tokens()));
    f.read(0, f.tokens(), all.data());
  });
  return 0;
}
