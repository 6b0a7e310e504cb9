#include "peakbound/comm/agree.h"

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {

void agree(Communicator& world, const std::function<void()>& step) {
  std::string failure;
  bool failed = false;
  try {
    step();
  } catch (const Error& e) {
    failed = true;
    failure = e.what();
  } catch (const std::bad_alloc&) {
    failed = true;
    failure = "out of host memory";
  }
  const int W = world.size(), r = world.rank();
  // The lowest failing rank: max over ranks of W - rank (0 when none failed).
  std::int64_t first = failed ? W - r : 0;
  world.all_reduce(&first, 1, DType::i64, ReduceOp::max);
  if (first == 0) return;
  const int root = W - static_cast<int>(first);
  std::int64_t len = r == root ? static_cast<std::int64_t>(failure.size()) : 0;
  world.broadcast(&len, 1, DType::i64, root);
  std::vector<char> text(static_cast<std::size_t>(len));
  if (r == root) text.assign(failure.begin(), failure.end());
  if (len > 0) world.broadcast(text.data(), text.size(), DType::u8, root);
  std::string message(text.begin(), text.end());
  if (root != 0 && W > 1) message = "rank " + std::to_string(root) + ": " + message;
  throw AgreedError(message);
}

}  // namespace peakbound
