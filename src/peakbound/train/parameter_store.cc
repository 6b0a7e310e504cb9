#include "peakbound/train/parameter_store.h"

#include <cstddef>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/ops/elementwise.h"

namespace peakbound {

namespace {

std::int64_t dim0(const TensorEntry& e) { return e.shape.empty() ? 1 : e.shape[0]; }

RowRange whole(const TensorEntry& e) { return {0, dim0(e)}; }

}  // namespace

ShardSelector replicate_all() {
  return [](const TensorEntry& e) -> std::optional<RowRange> { return whole(e); };
}

ShardSelector expert_parallel(const TensorTable& table, std::int64_t ep, std::int64_t ep_rank) {
  const std::int64_t E = table.config().num_experts;
  if (ep < 1) throw InvalidArgument("expert parallelism: ep must be at least 1, got " + std::to_string(ep));
  if (ep_rank < 0 || ep_rank >= ep)
    throw InvalidArgument("expert parallelism: ep_rank " + std::to_string(ep_rank) + " is outside [0, " +
                          std::to_string(ep) + ")");
  if (E > 0 && E % ep != 0)
    throw InvalidArgument("expert parallelism: " + std::to_string(E) + " experts do not split evenly over ep " +
                          std::to_string(ep) + " ranks");
  if (E == 0) return replicate_all();
  const std::int64_t per = E / ep;
  return [per, ep_rank](const TensorEntry& e) -> std::optional<RowRange> {
    if (!e.expert_sharded) return whole(e);
    // Fused experts (gpt-oss): one entry per layer, experts leading dim 0.
    if (e.expert < 0) return RowRange{ep_rank * per, (ep_rank + 1) * per};
    if (e.expert / per != ep_rank) return std::nullopt;
    return whole(e);
  };
}

std::int64_t ParameterView::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

ParameterLayoutBuilder::ParameterLayoutBuilder(const LayoutOptions& options) : options_(options) {
  if (options.align == 0 || options.total_multiple == 0)
    throw InvalidArgument("parameter layout: align and total_multiple must be positive");
}

void ParameterLayoutBuilder::add(const TensorEntry& e, const RowRange& rows) {
  if (rows.begin < 0 || rows.begin > rows.end || rows.end > dim0(e) || (e.shape.empty() && rows.rows() != 1))
    throw InvalidArgument("parameter layout: rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) +
                          ") of '" + e.name + "' are outside its " + std::to_string(dim0(e)) + " rows");
  ParameterView v;
  v.entry = e;
  v.rows = rows;
  v.shape = e.shape;
  if (!v.shape.empty()) v.shape[0] = rows.rows();
  v.offset = out_.elements;
  const auto n = static_cast<std::uint64_t>(v.numel());
  out_.numel += v.numel();
  // Round each view's end up so the next one starts aligned.
  const std::uint64_t align = options_.align;
  const std::uint64_t end = checked_add(out_.elements, n, "parameter store size");
  out_.elements = checked_mul((end + align - 1) / align, align, "parameter store size");
  out_.views.push_back(std::move(v));
}

ParameterLayout ParameterLayoutBuilder::finish() && {
  const std::uint64_t m = options_.total_multiple;
  out_.elements = checked_mul((out_.elements + m - 1) / m, m, "parameter store size");
  return std::move(out_);
}

ParameterLayout parameter_layout(const TensorTable& table, const ShardSelector& select,
                                 const LayoutOptions& options) {
  ParameterLayoutBuilder b(options);
  table.for_each([&](const TensorEntry& e) {
    if (const std::optional<RowRange> rows = select(e)) b.add(e, *rows);
  });
  return std::move(b).finish();
}

ParameterLayout parameter_layout(std::span<const TensorEntry> entries, const ShardSelector& select,
                                 const LayoutOptions& options) {
  ParameterLayoutBuilder b(options);
  for (const TensorEntry& e : entries)
    if (const std::optional<RowRange> rows = select(e)) b.add(e, *rows);
  return std::move(b).finish();
}

ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, std::uint64_t param_bytes,
                                              std::uint64_t grad_bytes) {
  return {buffer_spec(Component::params, layout.elements, param_bytes),
          buffer_spec(Component::grads, layout.elements, grad_bytes)};
}

ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, std::uint64_t elem_bytes) {
  return parameter_store_buffers(layout, elem_bytes, elem_bytes);
}

ParameterStoreBuffers parameter_store_buffers(const ParameterLayout& layout, Precision precision) {
  return parameter_store_buffers(layout, dtype_size(param_dtype(precision)), sizeof(float));
}

ParameterStoreBuffers parameter_store_buffers(const TensorTable& table, const ShardSelector& select,
                                              std::uint64_t elem_bytes, const LayoutOptions& options) {
  return parameter_store_buffers(parameter_layout(table, select, options), elem_bytes);
}

ParameterStoreBuffers parameter_store_buffers(const TensorTable& table, const ShardSelector& select,
                                              Precision precision, const LayoutOptions& options) {
  return parameter_store_buffers(parameter_layout(table, select, options), precision);
}

namespace {

Footprint store_footprint(const ParameterStoreBuffers& b) {
  Footprint f("parameter_store");
  f.device("resident", b.params).device("resident", b.grads);
  return f;
}

}  // namespace

Footprint parameter_store_footprint(const TensorTable& table, const ShardSelector& select,
                                    std::uint64_t elem_bytes, const LayoutOptions& options) {
  return store_footprint(parameter_store_buffers(table, select, elem_bytes, options));
}

Footprint parameter_store_footprint(const TensorTable& table, const ShardSelector& select, Precision precision,
                                    const LayoutOptions& options) {
  return store_footprint(parameter_store_buffers(table, select, precision, options));
}

ParameterStore::ParameterStore(Device& dev, const TensorTable& table, const ShardSelector& select,
                               const LayoutOptions& options, Precision precision, StoreMemory memory)
    : ParameterStore(dev, table, parameter_layout(table, select, options), precision, memory) {}

ParameterStore::ParameterStore(Device& dev, const TensorTable& table, ParameterLayout layout, Precision precision,
                               StoreMemory memory)
    : dev_(&dev), table_(table), precision_(precision), layout_(std::move(layout)) {
  index_.reserve(layout_.views.size());
  for (std::size_t i = 0; i < layout_.views.size(); ++i) index_.emplace(layout_.views[i].name(), i);
  const ParameterStoreBuffers b = parameter_store_buffers(layout_, precision_);
  if ((memory.params == nullptr) != (memory.grads == nullptr))
    throw InternalError("parameter store: the caller's memory needs both buffers or neither");
  if (memory.params != nullptr) {  // not owned: a Buffer without an allocator releases nothing
    params_ = Buffer(nullptr, Allocation{memory.params, 0, b.params.bytes, b.params.component});
    grads_ = Buffer(nullptr, Allocation{memory.grads, 0, b.grads.bytes, b.grads.component});
  } else {
    params_ = dev.allocate(b.params.component, b.params.bytes);
    grads_ = dev.allocate(b.grads.component, b.grads.bytes);
  }
  // Zero both whole (the padding stays zero for good), and wait, so a load on the
  // copy stream cannot be overwritten by this fill.
  Stream& s = dev.compute_stream();
  const auto n = static_cast<std::int64_t>(layout_.elements);
  if (param_dtype() == DType::bf16)
    ops::fill(dev, s, params_.as<bf16>(), n, 0.0f);
  else
    ops::fill(dev, s, params_.as<float>(), n, 0.0f);
  ops::fill(dev, s, grads_data(), n, 0.0f);
  dev.synchronize(s);
}

bool ParameterStore::contains(std::string_view name) const { return index_.count(std::string(name)) != 0; }

const ParameterView& ParameterStore::view(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end())
    throw InvalidArgument("parameter store: no tensor '" + std::string(name) + "' on this rank (" +
                          std::to_string(size()) + " held of the model's " + std::to_string(table_.size()) + ")");
  return layout_.views[it->second];
}

void* ParameterStore::param_raw(const ParameterView& v) const {
  return params_.as<std::byte>() + v.offset * dtype_size(param_dtype());
}

void ParameterStore::check_param_dtype(DType want) const {
  if (param_dtype() != want)
    throw InternalError("parameter store: asked for " + std::string(dtype_name(want)) + " parameters, but it holds " +
                        std::string(dtype_name(param_dtype())) + " ones (precision " +
                        std::string(precision_name(precision_)) + "; use param_as<T> / param_raw)");
}

void ParameterStore::set_pending_master(std::vector<float> master) {
  if (master.size() != layout_.elements)
    throw InternalError("parameter store: a pending master of " + std::to_string(master.size()) +
                        " values for a store of " + std::to_string(layout_.elements) + " elements");
  pending_master_ = std::move(master);
}

void ParameterStore::zero_grads(Stream& s) {
  ops::fill(*dev_, s, grads_data(), static_cast<std::int64_t>(layout_.elements), 0.0f);
}

}  // namespace peakbound
