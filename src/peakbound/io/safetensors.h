// SafeTensors, the Hugging Face checkpoint format: an 8-byte little-endian header
// length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the tensors' bytes (offsets relative to the
// end of the header). Reading maps the file and checks every header field against the
// file (offsets inside it, sizes equal to shape x dtype, no overlap), so a truncated or
// hostile file is a one-line InvalidArgument naming the file, never a crash. Writing is
// atomic: a temporary file in the same folder, flushed to disk, renamed over the target
// (a killed writer leaves the old file or the new one, never half of either).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/io/mapped_file.h"

namespace peakbound {

// "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL": bytes per element;
// 0 for a dtype this reader does not know.
std::size_t safetensors_dtype_size(std::string_view dtype);

// A tensor shape as errors print it: "[2, 3, 4]" ("[]" for a scalar).
std::string shape_text(const std::vector<std::int64_t>& shape);

struct SafeTensorInfo {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range in the data section
  std::int64_t numel() const;
};

// A safetensors header parsed from the whole file's bytes, every field checked against
// them: each tensor's [begin, end) lies in the data section and holds exactly numel x
// dtype-size bytes, no two non-empty tensors share a byte, no name is given twice.
struct SafeTensorsHeader {
  std::vector<SafeTensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // where the data section starts in the file: 8 + header length
};

// Reads `file` (read, not kept): throws InvalidArgument "<source>: <what is wrong>".
SafeTensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& source);

class SafeTensorsFile {
 public:
  // Throws InvalidArgument: "<path>: <what is wrong>".
  static SafeTensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  // Throws InvalidArgument naming the file and the tensor when it is absent.
  const SafeTensorInfo& info(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;
  // The tensor as f32 (from F32, BF16, F16 or F64) or as i64 (from I64, I32, I16, I8, U8);
  // another dtype is an InvalidArgument naming it.
  std::vector<float> read_f32(std::string_view name) const;
  std::vector<std::int64_t> read_i64(std::string_view name) const;

 private:
  std::string path_;
  MappedFile file_;
  const std::byte* data_ = nullptr;  // start of the data section
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes are copied as given (little-endian, row-major).
struct SafeTensorOut {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::uint64_t bytes = 0;
};

// Writes the tensors (in the given order) atomically. Throws InvalidArgument for a
// size that does not match shape x dtype or a repeated name, Error when the file
// system refuses (naming the path and the system's reason).
struct FileSum;
// `sum`, when given, receives the written file's size and CRC-32 (io/atomic_file.h).
void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, FileSum* sum = nullptr);

}  // namespace peakbound
