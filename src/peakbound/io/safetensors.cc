#include "peakbound/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/mapped_file.h"

namespace peakbound {

namespace {

using json = nlohmann::json;

// The format's own limit on the header (safetensors refuses larger ones too).
constexpr std::uint64_t kMaxHeader = 100ull << 20;

[[noreturn]] void bad(const std::string& path, const std::string& what) { throw InvalidArgument(path + ": " + what); }

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return bits_float(bits);
}

}  // namespace

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::size_t safetensors_dtype_size(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

std::int64_t SafeTensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafeTensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& path) {
  SafeTensorsHeader out;
  const std::uint64_t size = file.size();
  const std::byte* base = file.data();
  if (size < 8) bad(path, "too short for a safetensors header (" + std::to_string(size) + " bytes)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint64_t>(base[i]);
  if (n > kMaxHeader) bad(path, "header length " + std::to_string(n) + " exceeds the format's 100 MiB");
  if (n > size - 8) bad(path, "header length " + std::to_string(n) + " runs past the end of the file");
  // A key given twice is refused: the JSON reader would keep one of the two silently.
  std::set<std::string> names;
  auto no_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second)
      bad(path, "'" + parsed.get<std::string>() + "' is given twice in the header");
    return true;
  };
  json h;
  try {
    h = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + n), no_duplicates);
  } catch (const json::exception&) {
    bad(path, "the header is not valid JSON");
  }
  if (!h.is_object()) bad(path, "the header is not a JSON object");
  out.data_offset = 8 + n;
  const std::uint64_t data_size = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) out.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    const json& t = it.value();
    const std::string where = "tensor '" + it.key() + "'";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad(path, where + " needs dtype, shape and data_offsets");
    SafeTensorInfo info;
    info.name = it.key();
    if (!t["dtype"].is_string()) bad(path, where + ": dtype is not a string");
    info.dtype = t["dtype"].get<std::string>();
    const std::size_t es = safetensors_dtype_size(info.dtype);
    if (es == 0) bad(path, where + ": unknown dtype '" + info.dtype + "'");
    if (!t["shape"].is_array()) bad(path, where + ": shape is not a list");
    // Every running product stays a signed 64-bit count, so SafeTensorInfo::numel() never
    // overflows, a zero dimension after two huge ones ([2^62, 2, 0]) included.
    constexpr auto kMaxCount = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    std::uint64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned()) bad(path, where + ": a dimension is not a non-negative integer");
      const auto v = d.get<std::uint64_t>();
      if (v > kMaxCount || __builtin_mul_overflow(numel, v, &numel) || numel > kMaxCount)
        bad(path, where + ": its shape overflows 64 bits");
      info.shape.push_back(static_cast<std::int64_t>(v));
    }
    const json& o = t["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      bad(path, where + ": data_offsets is not [begin, end]");
    info.begin = o[0].get<std::uint64_t>();
    info.end = o[1].get<std::uint64_t>();
    std::uint64_t want = 0;
    if (__builtin_mul_overflow(numel, es, &want)) bad(path, where + ": its size overflows 64 bits");
    if (info.begin > info.end || info.end > data_size)
      bad(path, where + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                    "] lie outside the " + std::to_string(data_size) + "-byte data section (truncated file?)");
    if (info.end - info.begin != want)
      bad(path, where + ": " + std::to_string(info.end - info.begin) + " bytes for a " + info.dtype + " tensor of " +
                    std::to_string(numel) + " elements");
    out.tensors.push_back(std::move(info));
  }
  // No two non-empty tensors share bytes: in order of begin, each starts at or after the
  // furthest end so far (an empty tensor between two others hides nothing).
  std::vector<const SafeTensorInfo*> by_offset;
  for (const auto& t : out.tensors)
    if (t.begin != t.end) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  const SafeTensorInfo* furthest = nullptr;
  for (const SafeTensorInfo* t : by_offset) {
    if (furthest != nullptr && t->begin < furthest->end)
      bad(path, "tensors '" + furthest->name + "' and '" + t->name + "' overlap");
    if (furthest == nullptr || t->end > furthest->end) furthest = t;
  }
  return out;
}

SafeTensorsFile SafeTensorsFile::open(const std::string& path) {
  SafeTensorsFile f;
  f.path_ = path;
  f.file_ = MappedFile::open(path);
  SafeTensorsHeader h = parse_safetensors_header({f.file_.data(), static_cast<std::size_t>(f.file_.size())}, path);
  f.data_ = f.file_.data() + h.data_offset;
  f.tensors_ = std::move(h.tensors);
  f.metadata_ = std::move(h.metadata);
  return f;
}

bool SafeTensorsFile::contains(std::string_view name) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const SafeTensorInfo& t) { return t.name == name; });
}

const SafeTensorInfo& SafeTensorsFile::info(std::string_view name) const {
  for (const SafeTensorInfo& t : tensors_)
    if (t.name == name) return t;
  bad(path_, "no tensor '" + std::string(name) + "'");
}

std::span<const std::byte> SafeTensorsFile::bytes(std::string_view name) const {
  const SafeTensorInfo& t = info(name);
  return {data_ + t.begin, static_cast<std::size_t>(t.end - t.begin)};
}

std::vector<float> SafeTensorsFile::read_f32(std::string_view name) const {
  const SafeTensorInfo& t = info(name);
  const std::byte* p = data_ + t.begin;
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<float> out(n);
  if (t.dtype == "F32") {
    if (n > 0) std::memcpy(out.data(), p, n * 4);  // an empty vector's data() may be null
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = t.dtype == "BF16" ? to_f32(bf16{h}) : f16_to_f32(h);
    }
  } else if (t.dtype == "F64") {
    for (std::size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    bad(path_, "tensor '" + t.name + "' is " + t.dtype + ", not a floating-point dtype");
  }
  return out;
}

std::vector<std::int64_t> SafeTensorsFile::read_i64(std::string_view name) const {
  const SafeTensorInfo& t = info(name);
  const std::byte* p = data_ + t.begin;
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t.dtype == "I64") {
      std::memcpy(&out[i], p + 8 * i, 8);
    } else if (t.dtype == "I32") {
      std::int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    } else if (t.dtype == "I16") {
      std::int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    } else if (t.dtype == "I8") {
      out[i] = static_cast<std::int8_t>(p[i]);
    } else if (t.dtype == "U8") {
      out[i] = static_cast<std::uint8_t>(p[i]);
    } else {
      bad(path_, "tensor '" + t.name + "' is " + t.dtype + ", not an integer dtype");
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata, FileSum* sum) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const SafeTensorOut& t : tensors) {
    if (!names.insert(t.name).second) throw InvalidArgument(path + ": tensor '" + t.name + "' is given twice");
    const std::size_t es = safetensors_dtype_size(t.dtype);
    if (es == 0) throw InvalidArgument(path + ": tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) throw InvalidArgument(path + ": tensor '" + t.name + "' has a negative dimension");
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * es != t.bytes)
      throw InvalidArgument(path + ": tensor '" + t.name + "' has " + std::to_string(t.bytes) + " bytes for " +
                            std::to_string(numel) + " " + t.dtype + " elements");
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  std::vector<std::span<const std::byte>> parts;
  parts.emplace_back(reinterpret_cast<const std::byte*>(len), 8);
  parts.emplace_back(reinterpret_cast<const std::byte*>(header.data()), header.size());
  for (const SafeTensorOut& t : tensors) parts.emplace_back(static_cast<const std::byte*>(t.data), t.bytes);
  write_file_atomic(path, parts, sum);
}

}  // namespace peakbound
