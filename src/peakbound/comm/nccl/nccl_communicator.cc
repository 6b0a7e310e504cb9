#include "peakbound/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw CommError(std::string("nccl: ") + what + ": " + ncclGetErrorString(r) +
                    (r == ncclSystemError || r == ncclInternalError ? std::string(" (") + ncclGetLastError(nullptr) + ")" : ""));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("nccl communicator: ") + what + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::f64: return ncclFloat64;
    default: break;
  }
  throw InvalidArgument("nccl: no NCCL type for dtype " + std::string(dtype_name(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

ncclComm_t C(void* c) { return static_cast<ncclComm_t>(c); }

// Whether p is memory a GPU owns (device or managed), which NCCL moves; pageable or
// pinned host memory (a schedule's counts and plan metadata) goes over the bootstrap.
bool on_gpu(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown host pointer on an old runtime: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Both buffers of a collective on one side; a mix is a caller's bug, said by name.
bool both_on_gpu(const void* a, const void* b, const char* what) {
  const bool ga = on_gpu(a), gb = on_gpu(b);
  if (a && b && ga != gb)
    throw InvalidArgument(std::string("nccl ") + what + ": one buffer is in GPU memory and the other in host memory");
  return ga || gb;
}
cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }

// A request over an event recorded after the operation on its stream.
struct EventRequest final : Request::Impl {
  Event e;
  explicit EventRequest(Event ev) : e(std::move(ev)) {}
  void wait() override { e.synchronize(); }
  bool test() override { return e.query(); }
};

}  // namespace

NcclCommunicator::NcclCommunicator(CudaDevice& dev, std::unique_ptr<Communicator> bootstrap)
    : dev_(dev), bootstrap_(std::move(bootstrap)) {
  ncclUniqueId id;
  if (bootstrap_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  bootstrap_->broadcast(&id, sizeof id, DType::u8, 0);
  check_cuda(cudaSetDevice(dev_.ordinal()), "cudaSetDevice");
  ncclComm_t c = nullptr;
  check(ncclCommInitRank(&c, bootstrap_->size(), id, bootstrap_->rank()), "ncclCommInitRank");
  comm_ = c;
  coll_ = &dev_.create_stream("nccl");
  send_ = &dev_.create_stream("nccl-send");
  recv_ = &dev_.create_stream("nccl-recv");
}

NcclCommunicator::NcclCommunicator(CudaDevice& dev, std::unique_ptr<Communicator> bootstrap, void* comm, Split)
    : dev_(dev), bootstrap_(std::move(bootstrap)), comm_(comm) {
  coll_ = &dev_.create_stream("nccl");
  send_ = &dev_.create_stream("nccl-send");
  recv_ = &dev_.create_stream("nccl-recv");
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(C(comm_));
}

void NcclCommunicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    throw InvalidArgument(std::string("nccl ") + what + ": rank " + std::to_string(peer) + " outside a group of " +
                          std::to_string(size()));
}

void* NcclCommunicator::begin() {
  dev_.wait(*coll_, dev_.record(dev_.compute_stream()));
  return dev_.native_stream(*coll_);
}

void NcclCommunicator::finish(void* stream) {
  check_cuda(cudaStreamSynchronize(S(stream)), "cudaStreamSynchronize");
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(C(comm_), &async), "ncclCommGetAsyncError");
  check(async, "asynchronous error");
}

void NcclCommunicator::send(const void* buf, std::size_t count, DType t, int dst, int tag) {
  isend(buf, count, t, dst, tag).wait();
}

void NcclCommunicator::recv(void* buf, std::size_t count, DType t, int src, int tag) {
  irecv(buf, count, t, src, tag).wait();
}

Request NcclCommunicator::isend(const void* buf, std::size_t count, DType t, int dst, int tag) {
  check_peer(dst, "send");
  if (!on_gpu(buf)) return bootstrap_->isend(buf, count, t, dst, tag);
  dev_.wait(*send_, dev_.record(dev_.compute_stream()));
  check(ncclSend(buf, count, nccl_type(t), dst, C(comm_), S(dev_.native_stream(*send_))), "ncclSend");
  return Request(std::make_unique<EventRequest>(dev_.record(*send_)));
}

Request NcclCommunicator::irecv(void* buf, std::size_t count, DType t, int src, int tag) {
  check_peer(src, "recv");
  if (!on_gpu(buf)) return bootstrap_->irecv(buf, count, t, src, tag);
  dev_.wait(*recv_, dev_.record(dev_.compute_stream()));
  check(ncclRecv(buf, count, nccl_type(t), src, C(comm_), S(dev_.native_stream(*recv_))), "ncclRecv");
  return Request(std::make_unique<EventRequest>(dev_.record(*recv_)));
}

void NcclCommunicator::sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf,
                                std::size_t recv_count, int src, DType t, int) {
  check_peer(dst, "sendrecv");
  check_peer(src, "sendrecv");
  if (!both_on_gpu(sendbuf, recvbuf, "sendrecv"))
    return bootstrap_->sendrecv(sendbuf, send_count, dst, recvbuf, recv_count, src, t, 0);
  void* s = begin();
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(sendbuf, send_count, nccl_type(t), dst, C(comm_), S(s)), "ncclSend");
  check(ncclRecv(recvbuf, recv_count, nccl_type(t), src, C(comm_), S(s)), "ncclRecv");
  check(ncclGroupEnd(), "ncclGroupEnd");
  finish(s);
}

void NcclCommunicator::all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) {
  if (!on_gpu(buf)) return bootstrap_->all_reduce(buf, count, t, op);
  void* s = begin();
  check(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), C(comm_), S(s)), "ncclAllReduce");
  finish(s);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType t) {
  if (!both_on_gpu(send, recv, "all_gather")) return bootstrap_->all_gather(send, recv, count, t);
  void* s = begin();
  check(ncclAllGather(send, recv, count, nccl_type(t), C(comm_), S(s)), "ncclAllGather");
  finish(s);
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) {
  if (!both_on_gpu(send, recv, "reduce_scatter")) return bootstrap_->reduce_scatter(send, recv, recv_count, t, op);
  void* s = begin();
  check(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), C(comm_), S(s)), "ncclReduceScatter");
  finish(s);
}

void NcclCommunicator::broadcast(void* buf, std::size_t count, DType t, int root) {
  check_peer(root, "broadcast");
  if (!on_gpu(buf)) return bootstrap_->broadcast(buf, count, t, root);
  void* s = begin();
  check(ncclBroadcast(buf, buf, count, nccl_type(t), root, C(comm_), S(s)), "ncclBroadcast");
  finish(s);
}

namespace {
void check_counts(std::size_t n, std::span<const std::size_t> a, std::span<const std::size_t> b,
                  std::span<const std::size_t> c, std::span<const std::size_t> d) {
  if (a.size() != n || b.size() != n || c.size() != n || d.size() != n)
    throw InvalidArgument("nccl all_to_all_v: counts and displacements need one entry per rank (" + std::to_string(n) + ")");
}
}  // namespace

void NcclCommunicator::enqueue_all_to_all_v(void* s, const void* send, std::span<const std::size_t> send_counts,
                                            std::span<const std::size_t> send_displs, void* recv,
                                            std::span<const std::size_t> recv_counts,
                                            std::span<const std::size_t> recv_displs, DType t) {
  const auto n = static_cast<std::size_t>(size());
  const std::size_t es = dtype_size(t);
  check(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t j = 0; j < n; ++j) {
    const int peer = static_cast<int>(j);
    if (send_counts[j] > 0)
      check(ncclSend(static_cast<const char*>(send) + send_displs[j] * es, send_counts[j], nccl_type(t), peer, C(comm_),
                     S(s)),
            "ncclSend");
    if (recv_counts[j] > 0)
      check(ncclRecv(static_cast<char*>(recv) + recv_displs[j] * es, recv_counts[j], nccl_type(t), peer, C(comm_), S(s)),
            "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclCommunicator::all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                    std::span<const std::size_t> send_displs, void* recv,
                                    std::span<const std::size_t> recv_counts,
                                    std::span<const std::size_t> recv_displs, DType t) {
  check_counts(static_cast<std::size_t>(size()), send_counts, send_displs, recv_counts, recv_displs);
  if (!both_on_gpu(send, recv, "all_to_all_v"))
    return bootstrap_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  void* s = begin();
  enqueue_all_to_all_v(s, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  finish(s);
}

void NcclCommunicator::all_to_all_v_on(Device& dev, Stream& st, const void* send,
                                       std::span<const std::size_t> send_counts,
                                       std::span<const std::size_t> send_displs, void* recv,
                                       std::span<const std::size_t> recv_counts,
                                       std::span<const std::size_t> recv_displs, DType t) {
  check_counts(static_cast<std::size_t>(size()), send_counts, send_displs, recv_counts, recv_displs);
  if (&dev != static_cast<Device*>(&dev_))
    throw InvalidArgument("nccl all_to_all_v_on: the stream's device is not this communicator's");
  if (!both_on_gpu(send, recv, "all_to_all_v_on"))
    throw InvalidArgument("nccl all_to_all_v_on: the buffers must be GPU memory");
  enqueue_all_to_all_v(dev_.native_stream(st), send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
}

void NcclCommunicator::barrier() { bootstrap_->barrier(); }

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> sub = bootstrap_->split(color, key);
  ncclComm_t c = nullptr;
  check(ncclCommSplit(C(comm_), color, key, &c, nullptr), "ncclCommSplit");
  return std::unique_ptr<Communicator>(new NcclCommunicator(dev_, std::move(sub), c, Split{}));
}

}  // namespace peakbound
