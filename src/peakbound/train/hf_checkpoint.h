// Loading a Hugging Face model directory (config.json plus safetensors weights, as
// transformers' save_pretrained writes it) into a ParameterStore.
//
// Weight files: the shards named by model.safetensors.index.json's weight_map when the
// index exists, otherwise model.safetensors. Other *.safetensors in the folder (a
// reference.safetensors of gradients, an optimizer state) are NOT read: only what the
// checkpoint itself declares is the model.
//
// The checkpoint is checked whole against the TensorTable on every rank (so all ranks
// fail alike): every table tensor present once with the table's full shape, and no
// tensor the table does not know, except these, which transformers itself drops on load:
//   *.rotary_emb.inv_freq            (a buffer older checkpoints saved; it is recomputed)
//   model.layers.{L..L+mtp-1}.*      (DeepSeek's multi-token-prediction layers)
//   lm_head.weight                   (when tie_word_embeddings: the embedding is used)
// Then each tensor this rank holds (its rows, under expert / other sharding) is
// converted to f32 (from F32, BF16, F16 or F64), checked for NaN and infinity, and copied
// to the device. Errors are one InvalidArgument line naming the file and the tensor.
//
// Writing one (export, issue 28): HfModelWriter holds whole tensors in the dtype asked
// for, f32 or bf16 (rounded to nearest even once, from the fp32 master weights), and
// writes model.safetensors ("F32" / "BF16") and config.json with its dtype field saying
// what was written ("float32" / "bfloat16"), so from_pretrained(torch_dtype="auto")
// loads the weights in the dtype they hold.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"
#include "peakbound/model/model_config.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/train/parameter_store.h"

namespace peakbound {

// The weight files of a model directory, as paths, in the order they are read
// (the index's shards sorted by name, or model.safetensors). Throws InvalidArgument
// when the directory has neither, or the index is malformed or names a path outside it.
std::vector<std::string> hf_weight_files(const std::string& dir);

// True for a checkpoint tensor that transformers drops on load (see above).
bool hf_ignored_tensor(const ModelConfig& config, const std::string& name);

// Throws InvalidArgument when data[0, n) holds a NaN or an infinity, naming the tensor,
// the file and the element's index in the whole tensor (first + i): "model.norm.weight in
// /x/model.safetensors holds NaN at element 17". One pass over the host copy.
void check_finite_weights(const float* data, std::uint64_t n, const std::string& tensor, const std::string& file,
                          std::uint64_t first = 0);

// The host side of a load: checks the directory's weights against `table` (as above,
// whole, before any callback) and calls fn(view, values, n) for each tensor `select`
// picks with rows (n = view.numel() > 0), in checkpoint order: values[0, n) are the
// view's rows as f32 on the host (F32 as stored; BF16, F16, F64 converted exactly or,
// for F64, rounded), already checked for NaN and infinity (check_finite_weights).
// `values` is valid only during the call. view.offset is its offset in
// parameter_layout(table, select) with default options; callers address their own
// storage by name. An exception from fn propagates.
using HfTensorFn = std::function<void(const ParameterView& view, const float* values, std::uint64_t n)>;
void for_each_hf_tensor(const std::string& dir, const TensorTable& table, const ShardSelector& select,
                        const HfTensorFn& fn);

// for_each_hf_tensor over the tensors the store holds, uploading each: an f32 store gets
// the values as they are; a bf16 store gets host_to_bf16 of them (round to nearest even).
// Waits for every copy before returning.
void load_hf_weights(const std::string& dir, ParameterStore& store);

// A model directory loaded for one rank: config.json, its table, and the store filled.
struct HfModel {
  ModelConfig config;
  TensorTable table;
  ParameterStore store;
};
// Expert-parallel over `ep` ranks as rank `ep_rank` (1, 0: the whole model).
HfModel load_hf_model(Device& dev, const std::string& dir, std::int64_t ep = 1, std::int64_t ep_rank = 0);

// The dtype a config.json says its weights are in: its "dtype" field (the name
// transformers writes since 4.56), else "torch_dtype". bf16 for "bfloat16"; f32 for
// anything else or no field ("float16" included: an export offers f32 and bf16 only, and
// f32 holds every fp16 value exactly). `export`'s default dtype.
DType hf_config_dtype(const nlohmann::json& config);

// config.json's text for weights written in `dtype` (f32 or bf16): the text verbatim when
// its dtype fields already say so, else re-dumped (keys in their order, 2-space indent)
// with "torch_dtype" and "dtype", each where present ("torch_dtype" when neither is), set
// to "float32" / "bfloat16". InvalidArgument when the text is not a JSON object.
std::string hf_config_text_for(const std::string& config_text, DType dtype, const std::string& source);

// A Hugging Face model directory being assembled in one dtype, f32 or bf16. Each tensor
// is added whole in f32 and stored at once in the dtype (bf16: round to nearest even,
// core/dtype.h to_bf16), so an export holds every tensor once, in the written dtype.
class HfModelWriter {
 public:
  // InvalidArgument for a dtype other than f32 or bf16.
  explicit HfModelWriter(DType dtype);
  DType dtype() const { return dtype_; }
  // values.size() must be the shape's element count (PB_CHECK). bf16: InvalidArgument
  // naming the tensor and element when a value is not finite once rounded (a finite f32
  // beyond bf16's range rounds to infinity; the loader would refuse the file).
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const float> values);
  // Creates out_dir if needed and writes out_dir/model.safetensors (the tensors in the
  // order added, metadata {"format": "pt"}) then out_dir/config.json
  // (hf_config_text_for(config_text, dtype)), each atomically.
  void write(const std::string& out_dir, const std::string& config_text) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    std::vector<float> f32;  // the dtype's vector holds the values; the other is empty
    std::vector<bf16> b16;
  };
  DType dtype_;
  std::vector<Tensor> tensors_;
};

}  // namespace peakbound
