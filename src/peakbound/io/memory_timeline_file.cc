#include "peakbound/io/memory_timeline_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/path_check.h"

namespace peakbound {

std::string memory_timeline_path(const std::string& file, int rank, int world) {
  if (world <= 1) return file;
  const std::string tag = ".rank-" + std::to_string(rank);
  const std::size_t slash = file.find_last_of('/');
  const std::size_t dot = file.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == 0 ||
      (slash != std::string::npos && dot == slash + 1))
    return file + tag;
  return file.substr(0, dot) + tag + file.substr(dot);
}

void write_memory_timeline(const std::string& path, const MemoryTimeline& t) {
  write_text_atomic(path, t.to_json().dump() + "\n");
}

MemoryTimeline read_memory_timeline(const std::string& path) {
  // A folder would fail inside the stream ("basic_filebuf::underflow"), a FIFO block.
  require_input_file(path, "memory timeline", "the JSON written by --memory-timeline");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("memory timeline: cannot read '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument("memory timeline: '" + path + "' is not valid JSON");
  } catch (const std::ios_base::failure& e) {  // a read error inside the stream (EIO)
    throw InvalidArgument("memory timeline: cannot read '" + path + "' (" + e.code().message() + ")");
  }
  try {
    return MemoryTimeline::from_json(j);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(path + ": " + e.what());
  }
}

}  // namespace peakbound
