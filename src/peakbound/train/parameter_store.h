// ParameterStore: all of one rank's parameters in ONE device allocation
// (Component::params) and their gradients in ONE more (Component::grads), f32, llm.c
// style, with a view per named tensor. Under Precision::bf16 the parameters are bf16 (the
// copy the model computes with; the fp32 master lives in the optimizer) and the
// gradients stay f32; under f32 both are f32. Flat buffers let whole-model operations
// (zeroing gradients, all-reducing them, clipping, the optimizer) run as one call over
// one pointer, while layers address their tensors by Hugging Face name.
//
// The layout comes from the TensorTable in checkpoint order, filtered by a
// ShardSelector: for each table entry it says whether this rank holds it and which
// rows of dim 0 (all of them by default). Expert parallelism keeps experts
// e / (E / ep) == ep_rank (a fused expert tensor keeps those rows); everything else
// is replicated. Row ranges are there so FSDP / vocabulary sharding can later be
// another selector, not another store.
//
// Every view starts at a multiple of kViewAlignElements elements (256 bytes, the
// Arena's alignment), so each tensor is as aligned as a buffer of its own would be;
// the padding between views is zero in both buffers (+0.0 in either dtype) (set once at construction and
// never written by a view), so flat operations over the whole buffers see zeros there.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <span>
#include <utility>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/model/tensor_table.h"

namespace peakbound {

// Rows [begin, end) of a tensor's dim 0. A 0-d tensor is held whole as {0, 1}.
struct RowRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t rows() const { return end - begin; }
};

// The rows of `entry` this rank holds (a subrange of [0, dim 0)), or nullopt for none.
using ShardSelector = std::function<std::optional<RowRange>(const TensorEntry& entry)>;

// Every tensor, whole (one rank, no sharding).
ShardSelector replicate_all();
// Expert parallelism over `ep` ranks: rank `ep_rank` holds experts e with
// e / (E / ep) == ep_rank (per-expert entries kept or dropped, fused entries sliced on
// dim 0); every other tensor whole. Throws InvalidArgument unless 1 <= ep, E % ep == 0
// (when the model has experts) and 0 <= ep_rank < ep.
ShardSelector expert_parallel(const TensorTable& table, std::int64_t ep, std::int64_t ep_rank);

// One tensor held by the store.
struct ParameterView {
  TensorEntry entry;               // the table's entry (full, unsharded shape)
  RowRange rows;                   // rows of dim 0 held
  std::vector<std::int64_t> shape; // this rank's shape: entry.shape with dim 0 = rows.rows()
  std::uint64_t offset = 0;        // elements from the start of each buffer
  std::int64_t numel() const;
  const std::string& name() const { return entry.name; }
};

// The views and the buffer length (elements, padding included) for a table and selector.
struct ParameterLayout {
  std::vector<ParameterView> views;  // checkpoint order
  std::uint64_t elements = 0;        // buffer length, padding included
  std::int64_t numel = 0;            // elements held by views
};

inline constexpr std::uint64_t kViewAlignElements = 64;

// Where views start and how long the buffers are. The default aligns every view to
// 256 bytes. align 1 packs views back to back: a routed-expert store uses it so that
// a layer's experts form the one contiguous [E/EP, 3FH] block MoeDispatch reads.
// total_multiple rounds the buffer length up (a multiple of the sharding group's
// size lets reduce-scatter and all-gather split it evenly).
struct LayoutOptions {
  std::uint64_t align = kViewAlignElements;
  std::uint64_t total_multiple = kViewAlignElements;
};

// Builds a layout view by view, in the order the views are added (parameter_layout adds
// the selected entries in table order); several builders fed from one pass over a large
// table build several layouts at the cost of one (fsdp_unit_layouts).
class ParameterLayoutBuilder {
 public:
  // Throws InvalidArgument for an align or total_multiple of 0.
  explicit ParameterLayoutBuilder(const LayoutOptions& options);
  // Throws InvalidArgument when rows are outside [0, dim 0) of e.
  void add(const TensorEntry& e, const RowRange& rows);
  ParameterLayout finish() &&;

 private:
  LayoutOptions options_;
  ParameterLayout out_;
};

// Throws InvalidArgument when the selector returns rows outside [0, dim 0), or for an
// align or total_multiple of 0.
ParameterLayout parameter_layout(const TensorTable& table, const ShardSelector& select,
                                 const LayoutOptions& options = {});
// The same over the table's entries (TensorTable::entries(), in table order), which a
// caller sizing many stores of one large model materializes once.
ParameterLayout parameter_layout(std::span<const TensorEntry> entries, const ShardSelector& select,
                                 const LayoutOptions& options = {});

// The two device buffers a ParameterStore allocates: params at param_bytes per element,
// grads at grad_bytes (layout.elements each). The elem_bytes forms use one size for
// both (the f32 store: 4, 4); the Precision forms are what a ParameterStore of that
// precision allocates: params dtype_size(param_dtype(p)) (4 or 2), grads 4.
struct ParameterStoreBuffers {
  BufferSpec params, grads;
  std::uint64_t reserved() const { return params.reserved() + grads.reserved(); }
};
ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, std::uint64_t param_bytes,
                                              std::uint64_t grad_bytes);
ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, std::uint64_t elem_bytes);
ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, Precision precision);
ParameterStoreBuffers parameter_store_buffers(const TensorTable& table, const ShardSelector& select,
                                              std::uint64_t elem_bytes, const LayoutOptions& options = {});
ParameterStoreBuffers parameter_store_buffers(const TensorTable& table, const ShardSelector& select,
                                              Precision precision, const LayoutOptions& options = {});
// The same as a Footprint: one phase, "resident", holding both for the whole run.
Footprint parameter_store_footprint(const TensorTable& table, const ShardSelector& select,
                                    std::uint64_t elem_bytes, const LayoutOptions& options = {});
Footprint parameter_store_footprint(const TensorTable& table, const ShardSelector& select, Precision precision,
                                    const LayoutOptions& options = {});

// Where a store's two buffers live. Null (the default): the store allocates them from the
// device. Otherwise the caller's device memory, layout.elements long each (params in the
// store's param dtype, grads f32), which must outlive the store: MoeTransformer puts a
// store whose optimizer group is one rank in the tail of the FSDP shard buffers, which
// then is the store's own slice (no second copy of it, nothing copied between the two).
struct StoreMemory {
  void* params = nullptr;
  float* grads = nullptr;
};

class ParameterStore {
 public:
  // Allocates both buffers from the device (params in param_dtype(precision), grads f32),
  // or takes `memory`'s (both or neither: InternalError otherwise), and zeroes them
  // (waits for that).
  ParameterStore(Device& dev, const TensorTable& table, const ShardSelector& select = replicate_all(),
                 const LayoutOptions& options = {}, Precision precision = Precision::f32, StoreMemory memory = {});
  // The same with the layout parameter_layout(table, select, options) gave the caller.
  ParameterStore(Device& dev, const TensorTable& table, ParameterLayout layout, Precision precision,
                 StoreMemory memory = {});
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  ParameterStore(ParameterStore&&) = default;
  ParameterStore& operator=(ParameterStore&&) = delete;

  Device& device() const { return *dev_; }
  const TensorTable& table() const { return table_; }
  Precision precision() const { return precision_; }
  DType param_dtype() const { return peakbound::param_dtype(precision_); }

  // Tensors held, in checkpoint order.
  std::size_t size() const { return layout_.views.size(); }
  const std::vector<ParameterView>& views() const { return layout_.views; }
  std::vector<ParameterView>::const_iterator begin() const { return layout_.views.begin(); }
  std::vector<ParameterView>::const_iterator end() const { return layout_.views.end(); }
  std::int64_t numel() const { return layout_.numel; }

  bool contains(std::string_view name) const;
  // Throws InvalidArgument naming the tensor when this rank does not hold it.
  const ParameterView& view(std::string_view name) const;
  const std::vector<std::int64_t>& shape(std::string_view name) const { return view(name).shape; }
  // An f32 store's parameters (device pointers); InternalError (one line) on a bf16 store,
  // whose parameters are reached through param_as<bf16> / param_raw. Gradients are f32
  // in both precisions.
  float* param(std::string_view name) const { return params_data() + view(name).offset; }
  float* grad(std::string_view name) const { return grads_data() + view(name).offset; }
  float* param(const ParameterView& v) const { return params_data() + v.offset; }
  float* grad(const ParameterView& v) const { return grads_data() + v.offset; }
  // The parameters in the store's dtype: param_raw at v.offset x dtype_size(param_dtype())
  // bytes; param_as<T> checks T is param_dtype() (InternalError otherwise).
  void* param_raw(const ParameterView& v) const;
  void* param_raw(std::string_view name) const { return param_raw(view(name)); }
  template <class T> T* param_as(const ParameterView& v) const {
    check_param_dtype(dtype_of<T>());
    return params_.as<T>() + v.offset;
  }
  template <class T> T* param_as(std::string_view name) const { return param_as<T>(view(name)); }

  // The whole buffers (device pointers), `elements()` long, padding included.
  // params_data() is the f32 form (InternalError on a bf16 store); params_raw() either.
  float* params_data() const {
    check_param_dtype(DType::f32);
    return params_.as<float>();
  }
  void* params_raw() const { return params_.data(); }
  float* grads_data() const { return grads_.as<float>(); }
  std::uint64_t elements() const { return layout_.elements; }
  const ParameterLayout& layout() const { return layout_; }

  // Zeroes every gradient, asynchronously on s (the compute stream by default).
  void zero_grads(Stream& s);
  void zero_grads() { zero_grads(dev_->compute_stream()); }

  // The first fp32 master (issue 28): a bf16 store's parameters are rounded copies, so
  // whoever fills them (init, a Hugging Face load) leaves the fp32 values here, on the
  // host, [elements()] laid out as the params buffer, for the optimizer to take. set
  // replaces any pending vector (InternalError unless it is elements() long); take
  // returns it and leaves none pending (an empty vector when none was).
  void set_pending_master(std::vector<float> master);
  std::vector<float> take_pending_master() { return std::exchange(pending_master_, {}); }
  bool has_pending_master() const { return !pending_master_.empty(); }

 private:
  // InternalError unless the parameters are `want` (one line naming both dtypes).
  void check_param_dtype(DType want) const;

  Device* dev_;
  TensorTable table_;
  Precision precision_;
  ParameterLayout layout_;
  std::unordered_map<std::string, std::size_t> index_;
  Buffer params_, grads_;  // the caller's StoreMemory: Buffers without an allocator
  std::vector<float> pending_master_;
};

}  // namespace peakbound
