// FsdpUnits: the non-expert, non-head parameters sharded FSDP-style over the
// data-parallel group (FSDP2's per-module units). Units: the embedding, each decoder
// layer's tensors (attention, norms, router, shared / dense MLP), the final norm. Each
// unit is laid out like a ParameterStore of its tensors (views by Hugging Face name,
// padded to a multiple of 64 x G elements) and every rank holds 1/G of it: rank r the
// elements [r n/G, (r+1) n/G) of the unit's flat layout, parameters and gradients, in two
// flat shard buffers (all units' shards side by side). Use gathers the whole unit into a
// buffer the caller owns (all-gather); a unit's full gradient, once its backward is done,
// is reduce-scattered and ADDED into the gradient shard (so micro-batches accumulate).
//   persistent  params_shard, grads_shard [sum n_u / G + tail] (params, grads);
//               scratch [max n_u / G] (comm), the reduce-scatter's landing buffer
// `tail` elements after the units' shard belong to the trainer: the slices of the stores
// held whole, so that the optimizer's shard is these two buffers themselves and AdamW
// updates the FSDP shard in place (train/trainer.h).
// The model owns the gathered buffers (fsdp_buffers says their sizes): two slots of the
// largest layer unit for parameters and two for gradients (layer l uses slot l % 2, so its
// Block views never move), the embedding's and the final norm's while they are in use.
//
// Overlap (FSDP2's): prefetch() starts the next unit's gather (a non-blocking all-gather)
// into the slot the next layer uses while the current layer computes, and
// reduce_add_async() can hand a layer's gradient reduce-scatter to a thread of its own (a
// CollectiveThread over a split of the group: asked for at construction, where the group
// allows concurrent threads) while the next layer's backward runs. Both move or sum the
// same bits as the blocking calls: the gather moves bits, and the reduce-scatter is the
// same blocking collective, only on another thread. Neither holds more memory: the prefetch lands in the other of
// the two slots the layers alternate, the reduce-scatter reads the other gradient slot
// and lands in the scratch (one in flight at a time).
//
// Precision: under bf16 the parameters (params_shard, and so every gather and the
// gathered slots) are bf16, the copy the model computes with (the fp32 master lives in
// the optimizer): a gather moves the bf16 bits, converting nothing. Gradients stay f32
// in both precisions: grads_shard, the scratch, the full unit gradients reduce_add takes
// (reduce-scattered in f32, then added in f32, so micro-batches accumulate in fp32) and
// gather_grads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/comm/collective_thread.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/buffer.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/train/parameter_store.h"

namespace peakbound {

// Unit u's tensors (0 embedding, 1 + l layer l, L + 1 the final norm) and the layout
// options over a group of G ranks; the layouts of all units, in that order.
// with_embedding false: the embedding is sharded by vocabulary instead (ModelSchedules::
// vocab_parallel_embedding, in the head's store) and unit 0 is empty.
ShardSelector fsdp_unit_selector(const TensorTable& table, std::size_t u, bool with_embedding = true);
LayoutOptions fsdp_layout_options(int group_size);
std::vector<ParameterLayout> fsdp_unit_layouts(const TensorTable& table, int group_size, bool with_embedding = true);
// The unit holding entry e of a model of num_layers layers (none: an expert or head tensor,
// or the embedding without with_embedding).
std::optional<std::size_t> fsdp_unit_of(const TensorEntry& e, std::int64_t num_layers, bool with_embedding = true);

// The *_params specs are in param_dtype(precision) (4 or 2 bytes an element); the
// *_grads specs and the scratch are f32 in both precisions.
struct FsdpBuffers {
  BufferSpec params_shard, grads_shard, scratch;  // persistent
  BufferSpec layer_params, layer_grads;           // one slot each (two of each are held)
  BufferSpec embed_params, embed_grads;           // the embedding gathered / its full gradient
  BufferSpec norm_params, norm_grads;             // the final norm gathered / its full gradient
};
FsdpBuffers fsdp_buffers(const TensorTable& table, int group_size, Precision precision = Precision::f32,
                         std::uint64_t tail = 0, bool with_embedding = true);
// The same from the layouts fsdp_unit_layouts returned (a planner that sizes many runs of
// one model computes them once).
FsdpBuffers fsdp_buffers(const std::vector<ParameterLayout>& units, int group_size, Precision precision,
                         std::uint64_t tail = 0);

class FsdpUnits {
 public:
  // Allocates and zeroes the shard buffers (with `tail` more elements each) and the
  // scratch. group: the data-parallel group. reduce_thread: reduce_add_async runs on a
  // thread of its own where the group allows concurrent threads and the device is the
  // CPU (the constructor then splits the group: a collective over it).
  // with_embedding: as fsdp_unit_layouts (false: unit 0 is empty).
  FsdpUnits(Device& dev, const TensorTable& table, Communicator& group, Precision precision = Precision::f32,
            std::uint64_t tail = 0, bool reduce_thread = false, bool with_embedding = true);
  ~FsdpUnits();  // completes what is in flight
  FsdpUnits(const FsdpUnits&) = delete;
  FsdpUnits& operator=(const FsdpUnits&) = delete;

  std::size_t size() const { return layouts_.size(); }
  static std::size_t embed() { return 0; }
  // Unit u's selector (fsdp_unit_selector with this model's with_embedding).
  ShardSelector unit_selector(const TensorTable& table, std::size_t u) const {
    return fsdp_unit_selector(table, u, with_embedding_);
  }
  static std::size_t layer(std::int64_t l) { return static_cast<std::size_t>(1 + l); }
  std::size_t norm() const { return layouts_.size() - 1; }
  const ParameterLayout& layout(std::size_t u) const { return layouts_[u]; }
  std::uint64_t shard_len(std::size_t u) const { return layouts_[u].elements / static_cast<std::uint64_t>(g_.size()); }
  std::uint64_t shard_offset(std::size_t u) const { return offsets_[u]; }
  // The unit and view holding `name`; InvalidArgument when no unit has it.
  std::pair<std::size_t, const ParameterView*> find(const std::string& name) const;

  Precision precision() const { return precision_; }
  DType param_dtype() const { return peakbound::param_dtype(precision_); }
  // The parameter shard: params_shard() is the f32 form (InternalError, one line, under
  // bf16); params_shard_raw() is either dtype; params_shard_as<T> checks T.
  float* params_shard() const { return params_shard_as<float>(); }
  void* params_shard_raw() const { return params_.data(); }
  template <class T> T* params_shard_as() const {
    check_param_dtype(dtype_of<T>());
    return params_.as<T>();
  }
  float* grads_shard() const { return grads_.as<float>(); }
  std::uint64_t shard_elements() const { return shard_elements_; }
  // The trainer's elements after the shard in both buffers (parameters at
  // params_shard_raw() + shard_elements(), gradients at grads_shard() + shard_elements()).
  std::uint64_t tail_elements() const { return tail_; }
  Communicator& group() const { return g_; }
  const FsdpBuffers& buffers() const { return buffers_; }

  // dst [layout(u).elements] = the whole unit's parameters, in param_dtype() (collective
  // over the group; an all-gather of the shard's bits, no conversion). The float* form
  // checks the store is f32 (InternalError otherwise). Where prefetch(u, dst) started it,
  // this completes that gather.
  void gather(std::size_t u, void* dst);
  void gather(std::size_t u, float* dst);
  // Starts gather(u, dst) (collective; every rank prefetches the same units in the same
  // order): the gather(u, dst) that follows completes it, and until then dst must not be
  // read or written. One at a time: another prefetch, a gather of something else or
  // finish() completes the one in flight first.
  void prefetch(std::size_t u, void* dst);
  // The same for the gradients, f32 in both precisions (tests, checkpoints).
  void gather_grads(std::size_t u, float* dst);
  // full [layout(u).elements], f32 in both precisions: this rank's part of the unit's gradient, summed over the
  // group and ADDED into the gradient shard (collective).
  void reduce_add(std::size_t u, const float* full);
  // reduce_add started on the collective thread, where the units have one (else it is
  // reduce_add): `full` must stay untouched until it completes, which the next
  // reduce_add_async, a reduce_add or finish() does (one in flight at a time).
  void reduce_add_async(std::size_t u, const float* full);
  // Whether reduce_add_async runs on a thread of its own.
  bool reduces_in_background() const { return static_cast<bool>(reducer_); }
  // Completes the prefetch and the reduce-scatter in flight: after it the gradient shard
  // holds every unit's reduce_add and no gathered slot is being written.
  void finish();
  void zero_grads();  // finishes first

  // The first fp32 master (issue 28), as ParameterStore's: this rank's shard as fp32 on
  // the host, [shard_elements()] laid out as params_shard, left by whoever filled the
  // (bf16) shard for the optimizer to take. set: InternalError unless shard_elements()
  // long; take: the vector, leaving none pending (empty when none was).
  void set_pending_master(std::vector<float> master);
  std::vector<float> take_pending_master() { return std::exchange(pending_master_, {}); }
  bool has_pending_master() const { return !pending_master_.empty(); }

 private:
  // InternalError unless the parameters are `want` (one line naming both dtypes).
  void check_param_dtype(DType want) const;
  const std::byte* param_shard_of(std::size_t u) const;  // unit u's part of params_shard
  void finish_prefetch();
  void finish_reduce();  // the reduce-scatter in flight waited for and added into the shard
  void add_scratch(std::size_t u);  // the scratch (unit u's reduce-scatter) added into u's gradient shard

  struct Prefetch {
    std::size_t unit;
    void* dst;
    Request request;
  };

  Device& dev_;
  Communicator& g_;
  Precision precision_;
  std::vector<ParameterLayout> layouts_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t shard_elements_ = 0, tail_ = 0;
  FsdpBuffers buffers_;
  Buffer params_, grads_, scratch_;
  std::vector<float> pending_master_;
  bool with_embedding_ = true;
  std::optional<Prefetch> prefetch_;
  std::unique_ptr<CollectiveThread> reducer_;  // where the group allows one
  std::optional<std::size_t> reducing_;        // the unit whose reduce-scatter is in flight
};

}  // namespace peakbound
