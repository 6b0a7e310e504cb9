// Event: a point in a stream's work. query() says whether everything submitted to
// the stream before it was recorded has finished; synchronize() blocks until it has.
// A default-constructed Event is already complete. Copyable (shared state).
#pragma once

#include <memory>

namespace peakbound {

class Event {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool query() = 0;
    virtual void synchronize() = 0;
  };

  Event() = default;
  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  bool query() const { return !impl_ || impl_->query(); }
  void synchronize() const {
    if (impl_) impl_->synchronize();
  }
  Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace peakbound
