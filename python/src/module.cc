// peakbound._core: the library as the Python package (python/peakbound) sees it.
//
// Nothing here is a second copy of the CLI's or the library's logic. `plan` and `Run`
// take their settings as the CLI's flags do, through the same flag definitions
// (cli/plan_command.h, cli/train_command.h): the keyword arguments arrive as the keys of
// a --config file ("device_memory" as "device-memory"), so every value goes through its
// flag's own parser, range and one-line error. `ring_dtp_cross_entropy` runs the
// library's Ring-DTP on the caller's buffers (torch tensors, without copies) and its
// scratch in a CPU device's Arena sized by the schedule's own footprint.
//
// Errors: every peakbound and CLI11 error becomes peakbound._core.Error (a ValueError;
// python/peakbound/__init__.py names it peakbound.Error) with its one-line message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "peakbound/build_info.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/config_file.h"
#include "peakbound/cli/plan_command.h"
#include "peakbound/cli/train_command.h"
#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/host_adamw.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/plan/plan.h"
#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/schedules/vocab_loss.h"
#include "peakbound/train/run.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace peakbound::python {

namespace {

// Keyword arguments as a config file's entries: (flag name without dashes, its values).
using Entries = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Parses nothing from a command line (every option keeps its default), then applies the
// entries as the keys of a config file named `where` (errors read "where: ...").
void apply_entries(CLI::App& app, const std::string& where, const Entries& entries) {
  app.parse(std::vector<std::string>{});
  std::vector<cli::ConfigEntry> es;
  es.reserve(entries.size());
  for (const auto& [key, values] : entries) es.push_back({key, values, 0});
  cli::apply_config(&app, where, es);
}

// `peakbound plan`'s JSON document and its table, for the given flags.
std::pair<std::string, std::string> plan(const Entries& entries) {
  cli::PlanFlags f;
  CLI::App app("peakbound plan", "plan");
  cli::add_plan_flags(&app, f);
  apply_entries(app, "peakbound.plan", entries);
  const Plan p = cli::plan_from_flags(f, app);
  return {plan_json(p).dump(), plan_table(p)};
}

// The library's Run over the launched ranks (one, outside mpirun), its settings given as
// `peakbound train`'s flags. What it says goes to `print` (a Python callable taking one
// string) or nowhere.
class PyRun {
 public:
  PyRun(const Entries& entries, nb::object print) : print_(std::move(print)) {
    CLI::App app("peakbound train", "train");
    cli::add_train_flags(&app, f_);
    apply_entries(app, "peakbound.Run", entries);
    cli::validate_train_flags(f_, &app);
    RunPrinter printer;
    if (!print_.is_none())
      printer = [this](const std::string& text) {
        nb::gil_scoped_acquire gil;
        print_(text);
      };
    nb::gil_scoped_release nogil;
    run_ = std::make_unique<Run>(f_.run, std::move(printer));
  }
  ~PyRun() { close(); }  // without the GIL: the run's threads may print (which takes it) while it ends
  bool done() const { return run().done(); }
  std::int64_t steps_done() const { return run().steps_done(); }
  // The step's record (the metrics file's line) as JSON text.
  std::string step() {
    if (run().done()) throw InvalidArgument("Run.step: every step is taken (steps = " + std::to_string(f_.run.steps) + ")");
    RunStep r;
    {
      nb::gil_scoped_release nogil;
      r = run().step();
    }
    return r.json().dump();
  }
  double evaluate() {
    nb::gil_scoped_release nogil;
    return run().evaluate();
  }
  void save(const std::optional<std::string>& dir) {
    nb::gil_scoped_release nogil;
    if (dir)
      run().save(*dir);
    else
      run().save();
  }
  std::string last_saved() const { return run().last_saved(); }
  // The summary's JSON (train --json's object) and its table (planned beside measured).
  std::pair<std::string, std::string> finish() {
    if (!run().done())
      throw InvalidArgument("Run.finish: " + std::to_string(run().steps_done()) + " of " +
                            std::to_string(f_.run.steps) + " steps taken; step until done() first");
    RunSummary sum;
    {
      nb::gil_scoped_release nogil;
      sum = run().finish();
    }
    return {sum.json().dump(), sum.text()};
  }
  void close() {
    nb::gil_scoped_release nogil;
    run_.reset();
  }
  bool closed() const { return !run_; }
  Run& run() const {
    if (!run_) throw InvalidArgument("Run: this run is closed");
    return *run_;
  }

 private:
  cli::TrainFlags f_;
  nb::object print_;
  std::unique_ptr<Run> run_;
};

// ---- Ring-DTP on whole-vocabulary tensors ------------------------------------------

using F32Matrix = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I32Vector = nb::ndarray<std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// What one fused Ring-DTP pass measured.
struct VocabResult {
  double loss_sum = 0;
  std::int64_t count = 0;
  std::uint64_t peak_bytes = 0;       // the Arena's peak (Component::vocab)
  std::uint64_t footprint_bytes = 0;  // ring_dtp_step_footprint's device peak
  std::string mode;
};

// The vocabulary loss's options for the drop-in's arguments (chunk 0: the default),
// validated with the head's dimensions (InvalidArgument, one line).
VocabLossOptions vocab_options(std::int64_t chunk, std::int32_t ignore_index, Precision p, const VocabDims& dims) {
  VocabLossOptions o;
  if (chunk > 0) o.chunk = chunk;
  o.ignore_index = ignore_index;
  o.precision = p;
  validate(o);
  validate(dims);
  return o;
}

// Ring-DTP over the whole vocabulary (one rank: the fused form, one [chunk, V] logits block
// at a time): the summed loss of hidden [T, H] against weight [V, H] and the targets
// (ignore_index skipped), d_hidden = scale x dLoss/dHidden written, d_weight += scale x
// dLoss/dW; with d_hidden null the forward alone (the loss, no gradient). Every array is
// the caller's (no copy); the scratch comes from a CPU device whose budget is the
// schedule's footprint, so the Arena's peak is the schedule's peak. bf16: hidden, weight
// and d_hidden hold bf16 bits (int16 views), d_weight fp32.
template <class T>
VocabResult vocab_fused(const void* hidden, const std::int32_t* targets, std::int64_t tokens, const void* weight,
                        std::int64_t vocab, std::int64_t hidden_size, float scale, void* d_hidden, float* d_weight,
                        std::int64_t chunk, std::int32_t ignore_index, Precision p) {
  const VocabDims dims{vocab, hidden_size};
  const VocabLossOptions o = vocab_options(chunk, ignore_index, p, dims);
  const VocabLossShape shape = VocabLossShape::uniform(tokens, dims, 1);
  const Footprint fp = ring_dtp_step_footprint(shape, o, p);
  VocabResult r;
  r.footprint_bytes = fp.device_peak_total();
  auto dev = make_device("cpu", auto_device_budget(r.footprint_bytes));
  SingleRankCommunicator one;
  auto loss = make_ring_dtp_vocab_loss(*dev, one, dims, o);
  LossSum s;
  if (d_hidden != nullptr) {
    s = loss->forward_backward(static_cast<const T*>(hidden), targets, tokens, static_cast<const T*>(weight), scale,
                               static_cast<T*>(d_hidden), d_weight);
  } else {  // the loss only (no gradient wanted): the forward, its saved state dropped
    s = loss->forward(static_cast<const T*>(hidden), targets, tokens, static_cast<const T*>(weight));
    loss->discard();
  }
  dev->synchronize();
  r.loss_sum = s.loss;
  r.count = s.count;
  r.peak_bytes = dev->arena().peak(Component::vocab);
  r.mode = loss->mode_used();
  return r;
}

template <class A>
void expect_shape(const char* what, const A& a, std::int64_t rows, std::int64_t cols) {
  if (static_cast<std::int64_t>(a.shape(0)) != rows || static_cast<std::int64_t>(a.shape(1)) != cols)
    throw InvalidArgument(std::string("ring_dtp_cross_entropy: ") + what + " must be [" + std::to_string(rows) + ", " +
                          std::to_string(cols) + "], got [" + std::to_string(a.shape(0)) + ", " +
                          std::to_string(a.shape(1)) + "]");
}

// vocab_fused on arrays (E: float with float32 arrays, bf16 with their int16 bits), their
// shapes checked; the gradients both given or neither (the loss alone).
template <class E, class Matrix>
VocabResult ring_dtp_fused(Matrix hidden, I32Vector targets, Matrix weight, float scale,
                           std::optional<Matrix> d_hidden, std::optional<F32Matrix> d_weight, std::int64_t chunk,
                           std::int32_t ignore_index) {
  const std::int64_t T = hidden.shape(0), H = hidden.shape(1), V = weight.shape(0);
  expect_shape("weight", weight, V, H);
  if (d_hidden.has_value() != d_weight.has_value())
    throw InvalidArgument("ring_dtp_cross_entropy: give both gradients or neither");
  if (d_hidden) expect_shape("d_hidden", *d_hidden, T, H);
  if (d_weight) expect_shape("d_weight", *d_weight, V, H);
  if (static_cast<std::int64_t>(targets.shape(0)) != T)
    throw InvalidArgument("ring_dtp_cross_entropy: targets must have one entry per hidden row");
  void* dh = d_hidden ? d_hidden->data() : nullptr;
  float* dw = d_weight ? d_weight->data() : nullptr;
  nb::gil_scoped_release nogil;
  return vocab_fused<E>(hidden.data(), targets.data(), T, weight.data(), V, H, scale, dh, dw, chunk, ignore_index,
                        std::is_same_v<E, bf16> ? Precision::bf16 : Precision::f32);
}

// ---- a communicator over a torch.distributed group ----------------------------------

// peakbound's Communicator whose calls go to a Python object over a torch.distributed
// group (python/peakbound/torch.py's _TorchGroup: gloo on CPU tensors that view these
// buffers, no copies). Group ranks are the group's own (0 .. size - 1). The schedules call
// it with the GIL released; each call takes the GIL for its Python part.
class PyCommunicator final : public Communicator {
 public:
  explicit PyCommunicator(nb::object group) : g_(std::move(group)) {
    rank_ = nb::cast<int>(g_.attr("rank"));
    size_ = nb::cast<int>(g_.attr("size"));
  }
  ~PyCommunicator() override {
    nb::gil_scoped_acquire gil;
    g_.reset();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "torch.distributed"; }

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override { isend(buf, count, t, dst, tag).wait(); }
  void recv(void* buf, std::size_t count, DType t, int src, int tag) override { irecv(buf, count, t, src, tag).wait(); }
  Request isend(const void* buf, std::size_t count, DType t, int dst, int tag) override {
    return call_async("isend", addr(buf), count * dtype_size(t), dst, tag);
  }
  Request irecv(void* buf, std::size_t count, DType t, int src, int tag) override {
    return call_async("irecv", addr(buf), count * dtype_size(t), src, tag);
  }
  void sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf, std::size_t recv_count, int src,
                DType t, int tag) override {
    Request r = irecv(recvbuf, recv_count, t, src, tag);
    Request s = isend(sendbuf, send_count, t, dst, tag);
    s.wait();
    r.wait();
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    call("all_reduce", addr(buf), count, std::string(dtype_name(t)), op == ReduceOp::sum ? "sum" : "max");
  }
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    call("all_gather", addr(send), addr(recv), count, std::string(dtype_name(t)));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) override {
    call("reduce_scatter", addr(send), addr(recv), recv_count, std::string(dtype_name(t)),
         op == ReduceOp::sum ? "sum" : "max");
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    call("broadcast", addr(buf), count, std::string(dtype_name(t)), root);
  }
  void all_to_all_v(const void*, std::span<const std::size_t>, std::span<const std::size_t>, void*,
                    std::span<const std::size_t>, std::span<const std::size_t>, DType) override {
    throw Unavailable("a torch.distributed group's communicator has no all_to_all_v (Ring-DTP does not use it)");
  }
  void barrier() override { call("barrier"); }
  std::unique_ptr<Communicator> split(int, int) override {
    throw Unavailable("a torch.distributed group's communicator does not split; make the sub-group in torch");
  }

 private:
  static std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  template <class... A>
  void call(const char* name, A&&... a) {
    nb::gil_scoped_acquire gil;
    g_.attr(name)(std::forward<A>(a)...);
  }
  // A torch.distributed Work as a Request: wait() is its wait(), test() its is_completed().
  struct Work final : Request::Impl {
    explicit Work(nb::object w) : w(std::move(w)) {}
    ~Work() override {
      nb::gil_scoped_acquire gil;
      w.reset();
    }
    void wait() override {
      nb::gil_scoped_acquire gil;
      w.attr("wait")();
    }
    bool test() override {
      nb::gil_scoped_acquire gil;
      return nb::cast<bool>(w.attr("is_completed")());
    }
    nb::object w;
  };
  template <class... A>
  Request call_async(const char* name, A&&... a) {
    nb::gil_scoped_acquire gil;
    return Request(std::make_unique<Work>(g_.attr(name)(std::forward<A>(a)...)));
  }
  nb::object g_;
  int rank_ = 0, size_ = 1;
};

// Ring-DTP over a vocabulary sharded across a torch.distributed group: this rank's tokens
// and its shard of the head (vocab_shard(V, P, rank) rows). forward, then backward with the
// gradient's scale once it is known (autograd's backward): both collective over the group.
// Its scratch lives in a CPU device sized by ring_dtp_footprint for every rank's tokens.
class PyRingDtpShard {
 public:
  PyRingDtpShard(nb::object group, std::int64_t vocab, std::int64_t hidden, const std::vector<std::int64_t>& tokens,
                 std::int64_t chunk, std::int32_t ignore_index, bool bf16)
      : comm_(std::move(group)) {
    const VocabDims dims{vocab, hidden};
    const VocabLossOptions o = vocab_options(chunk, ignore_index, bf16 ? Precision::bf16 : Precision::f32, dims);
    if (static_cast<int>(tokens.size()) != comm_.size())
      throw InvalidArgument("ring_dtp_cross_entropy: one token count per rank of the group");
    VocabLossShape shape{tokens, dims, comm_.rank()};
    footprint_ = ring_dtp_footprint(shape, o, o.precision).device_peak_total();
    device_ = make_device("cpu", auto_device_budget(footprint_));
    loss_ = make_ring_dtp_vocab_loss(*device_, comm_, dims, o);
    tokens_ = tokens[static_cast<std::size_t>(comm_.rank())];
  }
  ~PyRingDtpShard() {
    nb::gil_scoped_release nogil;  // the members' destructors may wait for requests (they take the GIL)
    loss_.reset();
    device_.reset();
  }
  std::pair<double, std::int64_t> forward(std::uintptr_t hidden, std::uintptr_t targets, std::uintptr_t weight) {
    nb::gil_scoped_release nogil;
    const LossSum s = loss_->precision() == Precision::bf16
                          ? loss_->forward(reinterpret_cast<const bf16*>(hidden),
                                           reinterpret_cast<const std::int32_t*>(targets), tokens_,
                                           reinterpret_cast<const bf16*>(weight))
                          : loss_->forward(reinterpret_cast<const float*>(hidden),
                                           reinterpret_cast<const std::int32_t*>(targets), tokens_,
                                           reinterpret_cast<const float*>(weight));
    device_->synchronize();
    return {s.loss, s.count};
  }
  void backward(float scale, std::uintptr_t d_hidden, std::uintptr_t d_weight) {
    nb::gil_scoped_release nogil;
    if (loss_->precision() == Precision::bf16)
      loss_->backward(scale, reinterpret_cast<bf16*>(d_hidden), reinterpret_cast<float*>(d_weight));
    else
      loss_->backward(scale, reinterpret_cast<float*>(d_hidden), reinterpret_cast<float*>(d_weight));
    device_->synchronize();
  }
  void discard() { loss_->discard(); }
  std::uint64_t peak_bytes() const { return device_->arena().peak(Component::vocab); }
  std::uint64_t footprint_bytes() const { return footprint_; }
  std::string mode() const { return loss_->mode_used(); }

 private:
  PyCommunicator comm_;
  std::uint64_t footprint_ = 0;
  std::unique_ptr<Device> device_;
  std::unique_ptr<VocabLoss> loss_;
  std::int64_t tokens_ = 0;
};

// ---- AdamW with its state in peakbound's host memory, on a caller's tensors ----------

// Each parameter tensor's fp32 master, m and v in peakbound's host memory (Component::
// optimizer), updated by the AdamW kernel of the optimizer schedules (AVX2 / AVX-512,
// ops::host_adamw_update). Tensors are (address, elements, "f32" | "bf16"); the caller
// (python/peakbound/torch.py) keeps them alive and in place. Two ways to run a step:
//   direct    the kernel on the tensors where they are: for CPU tensors, whose "device"
//             is host memory, there is nothing to offload; an f32 parameter is its own
//             master weight (as torch.optim keeps it), a bf16 one is written from the
//             master. No copies.
//   streamed  the offload_stream schedule itself, one per tensor (over a CPU device whose
//             memory the tensors stand in for): gradients copied in bucket by bucket, the
//             update, parameters copied out, as it runs for a GPU's tensors.
// Both give the same bits (the schedules' kernel and scalars; python/tests/test_optimizer.py).
class PyOffloadAdamW {
 public:
  PyOffloadAdamW(const std::vector<std::tuple<std::uintptr_t, std::int64_t, std::string>>& params, float beta1,
                 float beta2, float eps, float weight_decay, bool streamed, std::uint64_t bucket_bytes, int threads)
      : pool_(std::max(1, threads)), streamed_(streamed) {
    o_.adam.beta1 = beta1, o_.adam.beta2 = beta2, o_.adam.eps = eps, o_.adam.weight_decay = weight_decay;
    o_.adam.max_grad_norm = 0.0f;  // torch.optim.AdamW does not clip
    if (bucket_bytes > 0) o_.bucket_bytes = bucket_bytes;
    std::uint64_t device_bytes = 0;
    for (const auto& [addr, n, dtype] : params) {
      if (dtype != "f32" && dtype != "bf16")
        throw InvalidArgument("OffloadStreamAdamW: parameters must be float32 or bfloat16, not " + dtype);
      if (n < 0) throw InvalidArgument("OffloadStreamAdamW: a negative element count");
      Param p;
      p.shard.params = reinterpret_cast<void*>(addr);
      p.shard.param_dtype = dtype == "f32" ? DType::f32 : DType::bf16;
      p.shard.grads = p.shard.params;  // until a step gives the gradients
      p.shard.grad_dtype = p.shard.param_dtype;
      p.shard.n = n;
      if (streamed_) device_bytes += optimizer_footprint("offload_stream", optimizer_shape(p.shard), o_).device_peak_total();
      params_.push_back(std::move(p));
    }
    if (streamed_) {
      device_ = make_device("cpu", auto_device_budget(device_bytes));
      for (Param& p : params_)
        p.schedule = make_optimizer_schedule("offload_stream", OptimizerContext{*device_, host_, pool_, comm_},
                                             p.shard, o_);
    } else {
      for (Param& p : params_) {
        const std::uint64_t bytes = static_cast<std::uint64_t>(p.shard.n) * sizeof(float);
        if (p.shard.param_dtype == DType::bf16) p.master = host_.allocate(Component::optimizer, bytes);
        p.m = host_.allocate(Component::optimizer, bytes);
        p.v = host_.allocate(Component::optimizer, bytes);
      }
    }
  }
  std::size_t size() const { return params_.size(); }
  // Sets parameter i's state (master from `master`, m and v zero or given, `steps` taken)
  // and writes the parameter from the master weights.
  void restore(std::size_t i, std::uintptr_t master, std::uintptr_t m, std::uintptr_t v, std::int64_t steps) {
    Param& p = at(i);
    if (steps < 0) throw InvalidArgument("OffloadStreamAdamW: a restored step count must be >= 0");
    const auto* mf = reinterpret_cast<const float*>(master);
    nb::gil_scoped_release nogil;
    if (p.schedule) {
      p.schedule->restore(mf, reinterpret_cast<const float*>(m), reinterpret_cast<const float*>(v), steps);
      device_->synchronize();
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(p.shard.n) * sizeof(float);
    if (p.shard.param_dtype == DType::f32) {
      std::memcpy(p.shard.params, mf, bytes);
    } else {
      std::memcpy(p.master.data(), mf, bytes);
      ops::host_to_bf16(static_cast<bf16*>(p.shard.params), mf, p.shard.n);
    }
    for (auto [to, from] : {std::pair{&p.m, m}, std::pair{&p.v, v}}) {
      if (from != 0)
        std::memcpy(to->data(), reinterpret_cast<const void*>(from), bytes);
      else
        std::memset(to->data(), 0, bytes);
    }
    p.steps = steps;
  }
  void read_state(std::size_t i, std::uintptr_t master, std::uintptr_t m, std::uintptr_t v) {
    Param& p = at(i);
    nb::gil_scoped_release nogil;
    auto* mf = reinterpret_cast<float*>(master);
    if (p.schedule) {
      p.schedule->read_state(mf, reinterpret_cast<float*>(m), reinterpret_cast<float*>(v));
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(p.shard.n) * sizeof(float);
    std::memcpy(mf, p.shard.param_dtype == DType::f32 ? p.shard.params : p.master.data(), bytes);
    std::memcpy(reinterpret_cast<void*>(m), p.m.data(), bytes);
    std::memcpy(reinterpret_cast<void*>(v), p.v.data(), bytes);
  }
  std::int64_t steps_taken(std::size_t i) { return at(i).schedule ? at(i).schedule->steps_taken() : at(i).steps; }
  // One step of the parameters whose gradients are given ((index, gradient address, dtype,
  // the group's learning rate)); the others keep their state, as torch's skip them.
  void step(const std::vector<std::tuple<std::size_t, std::uintptr_t, std::string, float>>& grads) {
    for (const auto& [i, addr, dtype, lr] : grads) {
      const DType want = at(i).shard.grad_dtype;
      if (dtype != (want == DType::f32 ? "f32" : "bf16"))
        throw InvalidArgument("OffloadStreamAdamW: parameter " + std::to_string(i) + "'s gradient is " + dtype +
                              "; it must have the parameter's dtype");
      if (addr == 0) throw InvalidArgument("OffloadStreamAdamW: a null gradient");
    }
    nb::gil_scoped_release nogil;
    for (const auto& [i, addr, dtype, lr] : grads) {
      Param& p = params_[i];
      if (p.schedule) {
        p.schedule->set_gradients(reinterpret_cast<const void*>(addr));
        p.schedule->step(lr, GradClip{});
        continue;
      }
      if (p.shard.n == 0) {
        ++p.steps;
        continue;
      }
      const AdamWStepScalars s = adamw_step_scalars(o_.adam, p.steps + 1, lr, 1.0f);
      float* master = p.shard.param_dtype == DType::f32 ? static_cast<float*>(p.shard.params) : p.master.as<float>();
      const AdamWTensors t{master,           p.m.as<float>(),      p.v.as<float>(), reinterpret_cast<const void*>(addr),
                           p.shard.grad_dtype, p.shard.params, p.shard.param_dtype, p.shard.n};
      ops::host_adamw_update(pool_, o_.simd, s, t);
      ++p.steps;
    }
    if (device_) device_->synchronize();
  }
  std::uint64_t host_bytes() const { return host_.peak(); }

 private:
  struct Param {
    ParamShard shard;
    std::unique_ptr<OptimizerSchedule> schedule;  // streamed
    Buffer master, m, v;                          // direct (master: bf16 parameters only)
    std::int64_t steps = 0;
  };
  Param& at(std::size_t i) {
    if (i >= params_.size()) throw InvalidArgument("OffloadStreamAdamW: no parameter " + std::to_string(i));
    return params_[i];
  }
  SingleRankCommunicator comm_;
  HostMemory host_;
  ThreadPool pool_;
  bool streamed_;
  OptimizerOptions o_;
  std::unique_ptr<Device> device_;
  std::vector<Param> params_;
};

}  // namespace

}  // namespace peakbound::python

NB_MODULE(_core, m) {
  using namespace peakbound;
  using namespace peakbound::python;
  m.doc() = "peakbound's library: the planner, the training run, and the schedules on caller buffers";

  // One exception type for the library's one-line errors (a ValueError subclass).
  static nb::object error = nb::borrow(nb::handle(PyErr_NewException("peakbound._core.Error", PyExc_ValueError, nullptr)));
  m.attr("Error") = error;
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const peakbound::Error& e) {
          PyErr_SetString(error.ptr(), e.what());
        } catch (const CLI::Error& e) {
          PyErr_SetString(error.ptr(), e.what());
        }
      },
      nullptr);

  m.def("version", [] { return std::string(PEAKBOUND_VERSION); });
  m.def("build_description", [] { return cli::build_description(); });
  m.def("blas_core_name", [] { return ops::blas_core_name(); });

  m.def("plan", &plan, "entries"_a,
        "`peakbound plan`: (the --json document as text, the table) for flags given as (name, [values]) pairs");

  nb::class_<PyRun>(m, "Run")
      .def(nb::init<const Entries&, nb::object>(), "entries"_a, "print"_a = nb::none())
      .def("done", &PyRun::done)
      .def("steps_done", &PyRun::steps_done)
      .def("step", &PyRun::step)
      .def("evaluate", &PyRun::evaluate)
      .def("save", &PyRun::save, "dir"_a = nb::none())
      .def("last_saved", &PyRun::last_saved)
      .def("finish", &PyRun::finish)
      .def("close", &PyRun::close)
      .def("closed", &PyRun::closed);

  m.def(
      "vocab_shard",
      [](std::int64_t vocab, int ranks, int rank) {
        if (ranks < 1 || rank < 0 || rank >= ranks) throw InvalidArgument("vocab_shard: rank must be in [0, ranks)");
        const VocabShard s = vocab_shard(vocab, ranks, rank);
        return std::pair<std::int64_t, std::int64_t>{s.offset, s.rows};
      },
      "vocab"_a, "ranks"_a, "rank"_a, "(offset, rows) of rank's shard of a vocabulary split over ranks");

  nb::class_<PyRingDtpShard>(m, "RingDtpShard")
      .def(nb::init<nb::object, std::int64_t, std::int64_t, const std::vector<std::int64_t>&, std::int64_t,
                    std::int32_t, bool>(),
           "group"_a, "vocab"_a, "hidden"_a, "tokens"_a, "chunk"_a, "ignore_index"_a, "bf16"_a)
      .def("forward", &PyRingDtpShard::forward)
      .def("backward", &PyRingDtpShard::backward)
      .def("discard", &PyRingDtpShard::discard)
      .def("peak_bytes", &PyRingDtpShard::peak_bytes)
      .def("footprint_bytes", &PyRingDtpShard::footprint_bytes)
      .def("mode", &PyRingDtpShard::mode);

  nb::class_<PyOffloadAdamW>(m, "OffloadStreamAdamW")
      .def(nb::init<const std::vector<std::tuple<std::uintptr_t, std::int64_t, std::string>>&, float, float, float,
                    float, bool, std::uint64_t, int>(),
           "params"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "streamed"_a = false, "bucket_bytes"_a = 0,
           "threads"_a = 1)
      .def("__len__", &PyOffloadAdamW::size)
      .def("restore", &PyOffloadAdamW::restore)
      .def("read_state", &PyOffloadAdamW::read_state)
      .def("steps_taken", &PyOffloadAdamW::steps_taken)
      .def("step", &PyOffloadAdamW::step)
      .def("host_bytes", &PyOffloadAdamW::host_bytes);

  nb::class_<VocabResult>(m, "VocabResult")
      .def_ro("loss_sum", &VocabResult::loss_sum)
      .def_ro("count", &VocabResult::count)
      .def_ro("peak_bytes", &VocabResult::peak_bytes)
      .def_ro("footprint_bytes", &VocabResult::footprint_bytes)
      .def_ro("mode", &VocabResult::mode);

  using I16Matrix = nb::ndarray<std::int16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
  m.def("ring_dtp_fused_f32", &ring_dtp_fused<float, F32Matrix>, "hidden"_a, "targets"_a, "weight"_a, "scale"_a,
        "d_hidden"_a.none(), "d_weight"_a.none(), "chunk"_a = 0, "ignore_index"_a = -100);
  m.def("ring_dtp_fused_bf16", &ring_dtp_fused<bf16, I16Matrix>, "hidden"_a, "targets"_a, "weight"_a, "scale"_a,
        "d_hidden"_a.none(), "d_weight"_a.none(), "chunk"_a = 0, "ignore_index"_a = -100);
}
