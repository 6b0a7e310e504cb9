#include "peakbound/train/hf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/mxfp4.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/train/gpt_oss_experts.h"

namespace peakbound {

namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::vector<std::string> index_shards(const fs::path& index) {
  const std::string where = index.string();
  std::ifstream in(index);
  if (!in) throw InvalidArgument(where + ": cannot be read: " + std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": invalid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InvalidArgument(where + ": no \"weight_map\" object naming each tensor's shard");
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw InvalidArgument(where + ": weight_map entry '" + name + "' is not a file name");
    const fs::path p(file.get<std::string>());
    bool escapes = p.empty() || p.is_absolute();
    for (const fs::path& part : p) escapes = escapes || part == "..";
    if (escapes)
      throw InvalidArgument(where + ": weight_map entry '" + name + "' names '" + p.string() +
                            "', not a file inside the model directory");
    shards.insert(p.string());
  }
  if (shards.empty()) throw InvalidArgument(where + ": weight_map is empty");
  return {shards.begin(), shards.end()};
}

bool convertible(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

// The torch dtype names config.json uses ("torch.bfloat16" in some older files).
bool names_bf16(const nlohmann::json& v) {
  return v.is_string() && (v.get<std::string>() == "bfloat16" || v.get<std::string>() == "torch.bfloat16");
}
bool names_f32(const nlohmann::json& v) {
  return v.is_string() && (v.get<std::string>() == "float32" || v.get<std::string>() == "torch.float32");
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& dir) {
  const fs::path d(dir);
  const fs::path index = d / "model.safetensors.index.json";
  std::error_code ec;
  std::vector<std::string> out;
  if (fs::exists(index, ec)) {
    for (const std::string& s : index_shards(index)) out.push_back((d / s).string());
    return out;
  }
  const fs::path single = d / "model.safetensors";
  if (!fs::exists(single, ec))
    throw InvalidArgument("model directory '" + dir +
                          "' has no model.safetensors and no model.safetensors.index.json");
  out.push_back(single.string());
  return out;
}

bool hf_ignored_tensor(const ModelConfig& config, const std::string& name) {
  if (ends_with(name, ".rotary_emb.inv_freq")) return true;
  if (config.tie_word_embeddings && name == "lm_head.weight") return true;
  constexpr std::string_view kLayers = "model.layers.";
  if (config.num_mtp_layers > 0 && name.compare(0, kLayers.size(), kLayers) == 0) {
    const std::size_t dot = name.find('.', kLayers.size());
    const std::string idx = name.substr(kLayers.size(), dot - kLayers.size());
    if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 10) {
      const std::int64_t layer = std::stoll(idx);
      return layer >= config.num_layers && layer < config.num_layers + config.num_mtp_layers;
    }
  }
  return false;
}

void check_finite_weights(const float* data, std::uint64_t n, const std::string& tensor, const std::string& file,
                          std::uint64_t first) {
  // Blocks of a branch-free test (vectorised), then the first bad element of a bad block.
  constexpr std::uint64_t kBlock = 4096;
  for (std::uint64_t b = 0; b < n; b += kBlock) {
    const std::uint64_t e = std::min(n, b + kBlock);
    bool ok = true;
    for (std::uint64_t i = b; i < e; ++i) ok &= std::fabs(data[i]) <= std::numeric_limits<float>::max();
    if (ok) continue;
    for (std::uint64_t i = b; i < e; ++i) {
      const float x = data[i];
      if (std::isfinite(x)) continue;
      const std::string what = std::isnan(x) ? "NaN" : (x > 0 ? "+inf" : "-inf");
      throw InvalidArgument(tensor + " in " + file + " holds " + what + " at element " + std::to_string(first + i) +
                            ": the weights are corrupt (re-download, re-export or pick another checkpoint)");
    }
  }
}

namespace {

// A model directory's weight files, opened, and which file holds each tensor, checked
// whole against the table (so no rank starts reading a broken checkpoint).
struct HfFiles {
  std::vector<SafeTensorsFile> files;
  std::unordered_map<std::string, std::size_t> where;
  // Weights stored as MXFP4 (gpt-oss's released experts): `name` absent, `name`_blocks and
  // `name`_scales present in one file (io/mxfp4.h), dequantized to f32 as they are read.
  std::unordered_set<std::string> mxfp4;
};

HfFiles open_checked(const std::string& dir, const TensorTable& table) {
  HfFiles h;
  std::vector<SafeTensorsFile>& files = h.files;
  std::unordered_map<std::string, std::size_t>& where = h.where;
  for (const std::string& p : hf_weight_files(dir)) files.push_back(SafeTensorsFile::open(p));

  // Where each checkpoint tensor lives; a name in two shards is ambiguous.
  for (std::size_t f = 0; f < files.size(); ++f)
    for (const SafeTensorInfo& t : files[f].tensors()) {
      auto [it, fresh] = where.emplace(t.name, f);
      if (!fresh)
        throw InvalidArgument(files[f].path() + ": tensor '" + t.name + "' is also in " +
                              files[it->second].path() + "; a checkpoint holds each tensor once");
    }

  // The whole checkpoint against the table first, so no rank starts copying a broken one.
  std::unordered_set<std::string> known;
  known.reserve(static_cast<std::size_t>(table.size()));
  table.for_each([&](const TensorEntry& e) {
    known.insert(e.name);
    auto it = where.find(e.name);
    const auto blocks = where.find(e.name + "_blocks"), scales = where.find(e.name + "_scales");
    if (it == where.end() && blocks != where.end() && scales != where.end()) {
      const SafeTensorsFile& f = files[blocks->second];
      if (scales->second != blocks->second)
        throw InvalidArgument(f.path() + ": " + e.name + "_blocks and _scales are in different shards; an MXFP4 "
                              "weight's two halves are read from one file");
      const std::vector<std::int64_t>& b = f.info(e.name + "_blocks").shape;  // [E, N, G, 16] -> [E, G*32, N]
      const std::vector<std::int64_t> deq =
          b.size() == 4 ? std::vector<std::int64_t>{b[0], b[2] * kMxfp4BlockElements, b[1]} : b;
      if (deq != e.shape)
        throw InvalidArgument(f.path() + ": MXFP4 tensor '" + e.name + "_blocks' " + shape_text(b) +
                              " dequantizes to " + shape_text(deq) + ", config.json implies " + shape_text(e.shape));
      known.insert(e.name + "_blocks");
      known.insert(e.name + "_scales");
      h.mxfp4.insert(e.name);
      where.emplace(e.name, blocks->second);
      return;
    }
    if (it == where.end()) {
      std::string looked = files[0].path();
      if (files.size() > 1) looked = std::to_string(files.size()) + " shards of " + dir;
      throw InvalidArgument(looked + ": missing tensor '" + e.name + "' " + shape_text(e.shape) + " that model '" +
                            table.config().name + "' (" + table.config().family + ") needs");
    }
    const SafeTensorsFile& f = files[it->second];
    const SafeTensorInfo& t = f.info(e.name);
    if (t.shape != e.shape)
      throw InvalidArgument(f.path() + ": tensor '" + e.name + "' has shape " + shape_text(t.shape) +
                            ", config.json implies " + shape_text(e.shape));
    if (!convertible(t.dtype))
      throw InvalidArgument(f.path() + ": tensor '" + e.name + "' is " + t.dtype +
                            "; weights must be F32, BF16, F16 or F64");
  });
  for (const SafeTensorsFile& f : files)
    for (const SafeTensorInfo& t : f.tensors())
      if (!known.count(t.name) && !hf_ignored_tensor(table.config(), t.name))
        throw InvalidArgument(f.path() + ": unknown tensor '" + t.name + "' " + shape_text(t.shape) + ": model '" +
                              table.config().name + "' (" + table.config().family + ") has no such parameter");
  return h;
}

// count elements of a checkpoint tensor from element `first`, as f32: F32 and BF16 sliced
// from the mapping, another dtype through the whole tensor's conversion.
std::vector<float> read_slice_f32(const SafeTensorsFile& f, const std::string& name, std::uint64_t first,
                                  std::uint64_t count) {
  const SafeTensorInfo& t = f.info(name);
  std::vector<float> out(count);
  if (t.dtype == "F32") {
    std::memcpy(out.data(), f.bytes(name).data() + first * sizeof(float), count * sizeof(float));
  } else if (t.dtype == "BF16") {
    std::vector<bf16> b(count);
    std::memcpy(b.data(), f.bytes(name).data() + first * sizeof(bf16), count * sizeof(bf16));
    for (std::uint64_t i = 0; i < count; ++i) out[i] = to_f32(b[i]);
  } else {
    const std::vector<float> all = f.read_f32(name);
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(first + count),
              out.begin());
  }
  return out;
}

// gpt-oss's expert (layer, e) from the checkpoint's fused tensors, packed as the trainer
// holds it (train/gpt_oss_experts.h), checked finite.
std::vector<float> gpt_oss_packed_expert(const HfFiles& h, const ModelConfig& c, std::int64_t layer, std::int64_t e) {
  const std::int64_t H = c.hidden_size, F = c.moe_intermediate_size;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  auto slice = [&](const std::string& name, std::int64_t per_expert) {
    const std::string full = p + name;
    const SafeTensorsFile& f = h.files[h.where.at(full)];
    const auto first = static_cast<std::uint64_t>(e * per_expert), n = static_cast<std::uint64_t>(per_expert);
    std::vector<float> v =
        h.mxfp4.count(full) ? read_mxfp4(f, full, e, e + 1).values : read_slice_f32(f, full, first, n);
    check_finite_weights(v.data(), n, full, f.path(), first);
    return v;
  };
  const std::vector<float> gu = slice("gate_up_proj", 2 * F * H), d = slice("down_proj", F * H);
  std::vector<float> gub(static_cast<std::size_t>(2 * F), 0.0f), db(static_cast<std::size_t>(H), 0.0f);
  if (c.mlp_bias) {
    gub = slice("gate_up_proj_bias", 2 * F);
    db = slice("down_proj_bias", H);
  }
  std::vector<float> packed(static_cast<std::size_t>(gpt_oss_expert_floats(H, F)));
  gpt_oss_pack_expert(packed.data(), gu.data(), gub.data(), d.data(), db.data(), H, F);
  if (!c.mlp_bias) packed.resize(static_cast<std::size_t>(3 * F * H));
  return packed;
}

}  // namespace

void for_each_hf_tensor(const std::string& dir, const TensorTable& table, const ShardSelector& select,
                        const HfTensorFn& fn) {
  // gpt-oss's experts in the trainer's layout come from the checkpoint's fused tensors:
  // the files are checked against the checkpoint's names, each expert packed once.
  const bool convert = table.converts_experts();
  const HfFiles h = open_checked(dir, convert ? TensorTable(table.config()) : table);
  std::int64_t packed_layer = -1, packed_expert = -1;
  std::vector<float> packed;
  // Each selected tensor's rows as f32 on the host: F32 straight from the mapping (through
  // an aligned copy where the mapping is not 4-byte aligned), other dtypes converted.
  for (const ParameterView& v : parameter_layout(table, select).views) {
    if (convert && v.entry.kind == TensorKind::expert) {
      if (v.entry.layer != packed_layer || v.entry.expert != packed_expert) {
        packed = gpt_oss_packed_expert(h, table.config(), v.entry.layer, v.entry.expert);
        packed_layer = v.entry.layer;
        packed_expert = v.entry.expert;
      }
      const std::int64_t H = table.config().hidden_size, F = table.config().moe_intermediate_size;
      const std::int64_t row = v.entry.shape.size() > 1 ? v.entry.shape[1] : 1;
      const std::int64_t at = gpt_oss_piece_offset(v.name(), H, F) + v.rows.begin * row;
      if (v.numel() > 0) fn(v, packed.data() + at, static_cast<std::uint64_t>(v.numel()));
      continue;
    }
    const SafeTensorsFile& f = h.files[h.where.at(v.name())];
    if (h.mxfp4.count(v.name())) {  // the rows (experts) held, dequantized
      const std::vector<float> deq = read_mxfp4(f, v.name(), v.rows.begin, v.rows.end).values;
      check_finite_weights(deq.data(), deq.size(), v.name(), f.path(), 0);
      if (!deq.empty()) fn(v, deq.data(), deq.size());
      continue;
    }
    const SafeTensorInfo& t = f.info(v.name());
    const std::int64_t full_rows = t.shape.empty() ? 1 : t.shape[0];
    const std::int64_t row = full_rows == 0 ? 0 : t.numel() / full_rows;
    const auto first = static_cast<std::uint64_t>(v.rows.begin * row);
    const auto count = static_cast<std::uint64_t>(v.numel());
    if (count == 0) continue;
    std::vector<float> staged;
    const float* src = nullptr;
    if (t.dtype == "F32") {
      const std::byte* at = f.bytes(v.name()).data() + first * sizeof(float);
      if (reinterpret_cast<std::uintptr_t>(at) % alignof(float) == 0) {
        src = reinterpret_cast<const float*>(at);
      } else {  // a header length that is not a multiple of 4: read through an aligned copy
        staged.resize(count);
        std::memcpy(staged.data(), at, count * sizeof(float));
        src = staged.data();
      }
    } else {
      staged = f.read_f32(v.name());
      src = staged.data() + first;
    }
    check_finite_weights(src, count, v.name(), f.path(), first);  // on the host copy, before fn sees it
    fn(v, src, count);
  }
}

void load_hf_weights(const std::string& dir, ParameterStore& store) {
  // The rows the store holds, so the callback's views are the store's (up to offset).
  const ShardSelector held = [&store](const TensorEntry& e) -> std::optional<RowRange> {
    if (!store.contains(e.name)) return std::nullopt;
    return store.view(e.name).rows;
  };
  Device& dev = store.device();
  Stream& s = dev.copy_stream();
  const bool narrow = store.param_dtype() == DType::bf16;
  std::vector<bf16> b16;
  for_each_hf_tensor(dir, store.table(), held, [&](const ParameterView& v, const float* values, std::uint64_t n) {
    void* dst = store.param_raw(v.name());
    if (narrow) {  // a bf16 store: rounded to nearest even on the host, as AdamW's narrowing
      b16.resize(n);
      ops::host_to_bf16(b16.data(), values, static_cast<std::int64_t>(n));
      dev.memcpy_async(dst, b16.data(), n * sizeof(bf16), CopyKind::host_to_device, s);
    } else {
      dev.memcpy_async(dst, values, n * sizeof(float), CopyKind::host_to_device, s);
    }
    dev.synchronize(s);  // `values` (and the staging) live only during the call
  });
}

DType hf_config_dtype(const nlohmann::json& config) {
  if (!config.is_object()) return DType::f32;
  for (const char* key : {"dtype", "torch_dtype"})
    if (config.contains(key) && !config[key].is_null()) return names_bf16(config[key]) ? DType::bf16 : DType::f32;
  return DType::f32;
}

std::string hf_config_text_for(const std::string& config_text, DType dtype, const std::string& source) {
  PB_CHECK(dtype == DType::f32 || dtype == DType::bf16);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(source + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw InvalidArgument(source + ": not a JSON object");
  const bool bf = dtype == DType::bf16;
  const char* name = bf ? "bfloat16" : "float32";
  bool any = false, agree = true;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!j.contains(key)) continue;
    any = true;
    agree = agree && (bf ? names_bf16(j[key]) : names_f32(j[key]));
  }
  if (any && agree) return config_text;
  if (!any) j["torch_dtype"] = name;
  for (const char* key : {"torch_dtype", "dtype"})
    if (j.contains(key)) j[key] = name;
  return j.dump(2) + "\n";
}

static_assert(sizeof(bf16) == 2, "BF16 tensors are written from bf16 arrays as they are");

HfModelWriter::HfModelWriter(DType dtype) : dtype_(dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw InvalidArgument("a Hugging Face export is written in f32 or bf16, not " + std::string(dtype_name(dtype)));
}

void HfModelWriter::add(std::string name, std::vector<std::int64_t> shape, std::span<const float> values) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  PB_CHECK(static_cast<std::size_t>(n) == values.size());
  Tensor t{std::move(name), std::move(shape), {}, {}};
  if (dtype_ == DType::f32) {
    t.f32.assign(values.begin(), values.end());
  } else {
    t.b16.resize(values.size());
    ops::host_to_bf16(t.b16.data(), values.data(), n);
    // A finite weight beyond bf16's largest finite value rounds to infinity, which the loader
    // (check_finite_weights) would refuse: refused here instead, before anything is written.
    bool finite = true;
    for (const bf16 b : t.b16) finite &= (b.bits & 0x7f80u) != 0x7f80u;
    for (std::size_t i = 0; !finite && i < t.b16.size(); ++i)
      if ((t.b16[i].bits & 0x7f80u) == 0x7f80u)
        throw InvalidArgument("tensor '" + t.name + "' element " + std::to_string(i) + " (" +
                              std::to_string(values[i]) + ") is not finite in bf16 (its largest is about 3.39e38): " +
                              "export with --dtype f32");
  }
  tensors_.push_back(std::move(t));
}

void HfModelWriter::write(const std::string& out_dir, const std::string& config_text) const {
  const std::string config = hf_config_text_for(config_text, dtype_, "config.json");
  std::vector<SafeTensorOut> out;
  out.reserve(tensors_.size());
  for (const Tensor& t : tensors_) {
    if (dtype_ == DType::f32)
      out.push_back({t.name, "F32", t.shape, t.f32.data(), t.f32.size() * sizeof(float)});
    else
      out.push_back({t.name, "BF16", t.shape, t.b16.data(), t.b16.size() * sizeof(bf16)});
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create the export folder: " + ec.message());
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), out, {{"format", "pt"}});
  write_text_atomic((fs::path(out_dir) / "config.json").string(), config);
}

HfModel load_hf_model(Device& dev, const std::string& dir, std::int64_t ep, std::int64_t ep_rank) {
  ModelConfig config = load_hf_config(dir);
  TensorTable table(config);
  ParameterStore store(dev, table, expert_parallel(table, ep, ep_rank));
  load_hf_weights(dir, store);
  return HfModel{std::move(config), std::move(table), std::move(store)};
}

}  // namespace peakbound
