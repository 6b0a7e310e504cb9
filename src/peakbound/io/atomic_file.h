// Files that are either wholly old or wholly new, never half-written: a temporary file
// in the same folder, written, flushed to disk (fsync), renamed over the target, and the
// folder flushed so that the rename itself is durable. A killed writer leaves the old
// file (or none) and at worst a stray ".NAME.tmpXXXXXX" beside it. Errors are peakbound
// Errors naming the path and the system's reason ("No space left on device",
// "Permission denied"), and the temporary file is removed. A target that
// exists and is not a regular file (a device, FIFO, socket or folder) is refused before
// anything is written: the rename would replace it.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace peakbound {

struct FileSum;
// Writes the parts one after another as the file's whole content; `sum`, when given,
// receives the size and CRC-32 of what was written (no second read of the file).
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> parts,
                       FileSum* sum = nullptr);
void write_text_atomic(const std::string& path, std::string_view text);
// Flushes a folder's entries (creations, renames, removals in it) to disk.
void fsync_directory(const std::string& dir);

// CRC-32 (IEEE 802.3, zlib's crc32) of `n` bytes, continuing from `crc` (0 to start).
std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc = 0);
// The CRC-32 and size of a whole file; Error naming the path when it cannot be read.
struct FileSum {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};
FileSum file_sum(const std::string& path);

}  // namespace peakbound
