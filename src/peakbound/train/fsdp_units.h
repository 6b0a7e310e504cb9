// FsdpUnits: the non-expert, non-head parameters sharded FSDP-style over the
// data-parallel group (FSDP2's per-module units). Units: the embedding, each decoder
// layer's tensors (attention, norms, router, shared / dense MLP), the final norm. Each
// unit is laid out like a ParameterStore of its tensors (views by Hugging Face name,
// padded to a multiple of 64 x G elements) and every rank holds 1/G of it: rank r the
// elements [r n/G, (r+1) n/G) of the unit's flat layout, parameters and gradients, in two
// flat shard buffers (all units' shards side by side). Use gathers the whole unit into a
// buffer the caller owns (all-gather); a unit's full gradient, once its backward is done,
// is reduce-scattered and ADDED into the gradient shard (so micro-batches accumulate).
//   persistent  params_shard, grads_shard [sum n_u / G] (params, grads);
//               scratch [max n_u / G] (comm), the reduce-scatter's landing buffer
// The model owns the gathered buffers (fsdp_buffers says their sizes): two slots of the
// largest layer unit for parameters and two for gradients (layer l uses slot l % 2, so its
// Block views never move), the embedding's and the final norm's while they are in use.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/buffer.h"
#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/train/parameter_store.h"

namespace peakbound {

// Unit u's tensors (0 embedding, 1 + l layer l, L + 1 the final norm) and the layout
// options over a group of G ranks; the layouts of all units, in that order.
ShardSelector fsdp_unit_selector(const TensorTable& table, std::size_t u);
LayoutOptions fsdp_layout_options(int group_size);
std::vector<ParameterLayout> fsdp_unit_layouts(const TensorTable& table, int group_size);

struct FsdpBuffers {
  BufferSpec params_shard, grads_shard, scratch;  // persistent
  BufferSpec layer_params, layer_grads;           // one slot each (two of each are held)
  BufferSpec embed_params, embed_grads;           // the embedding gathered / its full gradient
  BufferSpec norm_params, norm_grads;             // the final norm gathered / its full gradient
};
FsdpBuffers fsdp_buffers(const TensorTable& table, int group_size);

class FsdpUnits {
 public:
  // Allocates and zeroes the shard buffers and the scratch. group: the data-parallel group.
  FsdpUnits(Device& dev, const TensorTable& table, Communicator& group);

  std::size_t size() const { return layouts_.size(); }
  static std::size_t embed() { return 0; }
  static std::size_t layer(std::int64_t l) { return static_cast<std::size_t>(1 + l); }
  std::size_t norm() const { return layouts_.size() - 1; }
  const ParameterLayout& layout(std::size_t u) const { return layouts_[u]; }
  std::uint64_t shard_len(std::size_t u) const { return layouts_[u].elements / static_cast<std::uint64_t>(g_.size()); }
  std::uint64_t shard_offset(std::size_t u) const { return offsets_[u]; }
  // The unit and view holding `name`; InvalidArgument when no unit has it.
  std::pair<std::size_t, const ParameterView*> find(const std::string& name) const;

  float* params_shard() const { return params_.as<float>(); }
  float* grads_shard() const { return grads_.as<float>(); }
  std::uint64_t shard_elements() const { return shard_elements_; }
  Communicator& group() const { return g_; }
  const FsdpBuffers& buffers() const { return buffers_; }

  // dst [layout(u).elements] = the whole unit's parameters (collective over the group).
  void gather(std::size_t u, float* dst);
  // The same for the gradients (tests, checkpoints).
  void gather_grads(std::size_t u, float* dst);
  // full [layout(u).elements]: this rank's part of the unit's gradient, summed over the
  // group and ADDED into the gradient shard (collective).
  void reduce_add(std::size_t u, const float* full);
  void zero_grads();

 private:
  Device& dev_;
  Communicator& g_;
  std::vector<ParameterLayout> layouts_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t shard_elements_ = 0;
  FsdpBuffers buffers_;
  Buffer params_, grads_, scratch_;
};

}  // namespace peakbound
