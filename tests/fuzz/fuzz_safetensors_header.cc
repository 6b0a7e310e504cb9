// Fuzz target: the safetensors reader (io/safetensors.h) on a whole file's bytes. The
// header parser runs on the fuzzer's buffer itself (so ASan sees every read); on success
// every tensor must lie inside the data section with exactly numel x dtype-size bytes and
// no two may overlap, and the same bytes opened as a file read back every tensor.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "peakbound/io/safetensors.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  bool ok = false;
  fuzz::expect_ours([&] {
    const SafeTensorsHeader h = parse_safetensors_header(file, "fuzz.safetensors");
    FUZZ_CHECK(h.data_offset >= 8 && h.data_offset <= size);
    const std::uint64_t data_size = size - h.data_offset;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const SafeTensorInfo& t : h.tensors) {
      FUZZ_CHECK(t.begin <= t.end && t.end <= data_size);
      const std::size_t es = safetensors_dtype_size(t.dtype);
      FUZZ_CHECK(es > 0);
      for (std::int64_t d : t.shape) FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(t.numel() >= 0 && static_cast<std::uint64_t>(t.numel()) * es == t.end - t.begin);
      if (t.begin != t.end) ranges.emplace_back(t.begin, t.end);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second);
    ok = true;
  });
  if (!ok) return 0;
  // The public path: map the same bytes as a file and read every tensor as its kind.
  const fuzz::MemFile mem(data, size);
  fuzz::expect_ours([&] {
    const SafeTensorsFile f = SafeTensorsFile::open(mem.path());
    for (const SafeTensorInfo& t : f.tensors()) {
      FUZZ_CHECK(f.bytes(t.name).size() == t.end - t.begin);
      const bool real = t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16" || t.dtype == "F64";
      const bool integer = t.dtype == "I64" || t.dtype == "I32" || t.dtype == "I16" || t.dtype == "I8" || t.dtype == "U8";
      if (real) FUZZ_CHECK(f.read_f32(t.name).size() == static_cast<std::size_t>(t.numel()));
      if (integer) FUZZ_CHECK(f.read_i64(t.name).size() == static_cast<std::size_t>(t.numel()));
    }
  });
  return 0;
}
