#include "peakbound/comm/mpi/mpi_communicator.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"
#include "peakbound/core/phase_clock.h"

namespace peakbound {

namespace {

int g_thread_level = MPI_THREAD_SINGLE;

void finalize_at_exit() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = MPI_THREAD_SINGLE;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw CommError("MPI_Init_thread failed");
      g_thread_level = provided;
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&g_thread_level);
    }
  });
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

int to_int(std::size_t n, const char* call) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw CommError(std::string(call) + ": " + std::to_string(n) +
                    " elements exceed MPI's int count limit (2^31-1); split the buffer");
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;  // reductions use the bf16 ops below
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::f64: return MPI_DOUBLE;
  }
  PB_CHECK_MSG(false, "unknown dtype");
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = to_f32(a[i]), y = to_f32(b[i]);
    if (x > y || x != x) b[i] = a[i];  // NaN propagates, like MPI_MAX on floats in practice
  }
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t == DType::bf16) {
    static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;
    static std::once_flag once;
    std::call_once(once, [] {
      check(MPI_Op_create(&bf16_sum, 1, &sum), "MPI_Op_create(bf16 sum)");
      check(MPI_Op_create(&bf16_max, 1, &max), "MPI_Op_create(bf16 max)");
    });
    return op == ReduceOp::sum ? sum : max;
  }
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

// Every call that may move buffers: device memory open for MPI (strict mode) and the
// time counted as the step's exposed communication (core/phase_clock.h).
struct MpiCall {
  DeviceAccess open;
  CommunicationScope comm;
};

struct MpiRequest final : Request::Impl {
  MPI_Request req = MPI_REQUEST_NULL;
  void wait() override {
    const MpiCall call;  // MPI moves the buffers while it waits
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  bool test() override {
    const MpiCall call;
    int flag = 0;
    check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }
};

std::vector<int> ints(std::span<const std::size_t> v, const char* call) {
  std::vector<int> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_int(v[i], call);
  return out;
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  ensure_initialized();
  MPI_Comm dup;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(dup);
}

int MpiCommunicator::thread_level() { return g_thread_level; }

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && ring_comm_ != MPI_COMM_NULL) MPI_Comm_free(&ring_comm_);
  if (!fin && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    throw CommError(std::string(what) + ": rank " + std::to_string(peer) +
                    " does not exist in a group of " + std::to_string(size_));
}

void MpiCommunicator::send(const void* buf, std::size_t count, DType t, int dst, int tag) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(dst, "send");
  check(MPI_Send(buf, to_int(count, "send"), mpi_type(t), dst, tag, comm_), "MPI_Send");
}

void MpiCommunicator::recv(void* buf, std::size_t count, DType t, int src, int tag) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(src, "recv");
  check(MPI_Recv(buf, to_int(count, "recv"), mpi_type(t), src, tag, comm_, MPI_STATUS_IGNORE),
        "MPI_Recv");
}

Request MpiCommunicator::isend(const void* buf, std::size_t count, DType t, int dst, int tag) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(dst, "isend");
  auto r = std::make_unique<MpiRequest>();
  check(MPI_Isend(buf, to_int(count, "isend"), mpi_type(t), dst, tag, comm_, &r->req), "MPI_Isend");
  return Request(std::move(r));
}

Request MpiCommunicator::irecv(void* buf, std::size_t count, DType t, int src, int tag) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(src, "irecv");
  auto r = std::make_unique<MpiRequest>();
  check(MPI_Irecv(buf, to_int(count, "irecv"), mpi_type(t), src, tag, comm_, &r->req), "MPI_Irecv");
  return Request(std::move(r));
}

void MpiCommunicator::sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf,
                               std::size_t recv_count, int src, DType t, int tag) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(dst, "sendrecv");
  check_peer(src, "sendrecv");
  check(MPI_Sendrecv(sendbuf, to_int(send_count, "sendrecv"), mpi_type(t), dst, tag, recvbuf,
                     to_int(recv_count, "sendrecv"), mpi_type(t), src, tag, comm_,
                     MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
}

void MpiCommunicator::all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) {
  const MpiCall call;  // the buffers may be device memory
  if (t == DType::u8 && op == ReduceOp::sum)
    throw CommError("all_reduce: sum over u8 would overflow silently; use i32 or i64");
  check(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce"), mpi_type(t), mpi_op(t, op),
                      comm_),
        "MPI_Allreduce");
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType t) {
  const MpiCall call;  // the buffers may be device memory
  int n = to_int(count, "all_gather");
  check(MPI_Allgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_), "MPI_Allgather");
}

Request MpiCommunicator::iall_gather(const void* send, void* recv, std::size_t count, DType t) {
  const MpiCall call;  // the buffers may be device memory
  const int n = to_int(count, "iall_gather");
  auto r = std::make_unique<MpiRequest>();
  check(MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, &r->req), "MPI_Iallgather");
  return Request(std::move(r));
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                                     ReduceOp op) {
  const MpiCall call;  // the buffers may be device memory
  if (size_ == 1) {  // the sum over one rank is its values: one copy (Open MPI's makes two)
    if (recv_count > 0) std::memcpy(recv, send, recv_count * dtype_size(t));
    return;
  }
  if (t == DType::f32 && op == ReduceOp::sum && recv_count >= kRingMinElements) {
    ring_reduce_scatter(static_cast<const float*>(send), static_cast<float*>(recv), recv_count);
    return;
  }
  check(MPI_Reduce_scatter_block(send, recv, to_int(recv_count, "reduce_scatter"), mpi_type(t),
                                 mpi_op(t, op), comm_),
        "MPI_Reduce_scatter_block");
}

// P - 1 steps around the ring (P the group's size; chunk c of `send` is the part that ends
// on rank c). At step k rank r sends its partial sum of chunk r - k (mod P; at step 1 its own
// chunk r - 1 straight from `send`), receives the left neighbour's partial of chunk r - k - 1
// and adds its own values to it: chunk c is summed as ((a[c+1] + a[c+2]) + ...) + a[c] over
// the ranks from c + 1 round to c, the same order whatever the timing. The partials land in
// `recv` and one scratch chunk alternately, so that the last step's lands in `recv`: no
// copy of the input (Open MPI's recursive halving copies all of it into two buffers of its
// size first) and 1/P of it in scratch.
void MpiCommunicator::ring_reduce_scatter(const float* send, float* recv, std::size_t n) {
  if (ring_comm_ == MPI_COMM_NULL) {  // its own context: no user message can match the ring's
    check(MPI_Comm_dup(comm_, &ring_comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(ring_comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  if (ring_scratch_.size() < n) ring_scratch_.resize(n);
  const int P = size_, r = rank_, right = (r + 1) % P, left = (r - 1 + P) % P;
  const int count = to_int(n, "reduce_scatter");
  const auto chunk = [&](int c) { return send + static_cast<std::size_t>(((c % P) + P) % P) * n; };
  const float* out = chunk(r - 1);
  for (int k = 1; k < P; ++k) {
    float* in = (P - 1 - k) % 2 == 0 ? recv : ring_scratch_.data();
    check(MPI_Sendrecv(out, count, MPI_FLOAT, right, 0, in, count, MPI_FLOAT, left, 0, ring_comm_,
                       MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
    const float* own = chunk(r - k - 1);
    for (std::size_t i = 0; i < n; ++i) in[i] += own[i];
    out = in;
  }
}

void MpiCommunicator::broadcast(void* buf, std::size_t count, DType t, int root) {
  const MpiCall call;  // the buffers may be device memory
  check_peer(root, "broadcast");
  check(MPI_Bcast(buf, to_int(count, "broadcast"), mpi_type(t), root, comm_), "MPI_Bcast");
}

void MpiCommunicator::all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                   std::span<const std::size_t> send_displs, void* recv,
                                   std::span<const std::size_t> recv_counts,
                                   std::span<const std::size_t> recv_displs, DType t) {
  const MpiCall call;  // the buffers may be device memory
  auto n = static_cast<std::size_t>(size_);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n)
    throw CommError("all_to_all_v: counts and displacements must have one entry per rank (" +
                    std::to_string(n) + ")");
  auto sc = ints(send_counts, "all_to_all_v"), sd = ints(send_displs, "all_to_all_v");
  auto rc = ints(recv_counts, "all_to_all_v"), rd = ints(recv_displs, "all_to_all_v");
  check(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(),
                      mpi_type(t), comm_),
        "MPI_Alltoallv");
}

void MpiCommunicator::barrier() {
  const CommunicationScope comm;
  check(MPI_Barrier(comm_), "MPI_Barrier");
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(sub);
}

}  // namespace peakbound
