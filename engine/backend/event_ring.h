// Recycled events for a stream's Record: it runs once per layer and step, and must neither
// allocate nor (on a GPU) create an event each time. An event is handed out again only once the
// ring is its sole owner: whoever waited on it, or kept it to ask whether it is done, has let go
// (a stream that still has to complete or wait on it holds a reference until it has).
//
// Used by one thread (the one recording on the stream).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace specula {

template <typename E>
class EventRing {
 public:
  // A free event, or a new one from `make()` when every event is still held. The caller re-arms
  // it (records it on its stream).
  template <typename Make>
  std::shared_ptr<E> Next(Make make) {
    // Events are let go of in about the order they were recorded: start after the last one.
    for (size_t i = 0; i < events_.size(); ++i) {
      cursor_ = cursor_ + 1 < events_.size() ? cursor_ + 1 : 0;
      if (events_[cursor_].use_count() == 1) return events_[cursor_];
    }
    events_.push_back(make());
    cursor_ = events_.size() - 1;
    return events_.back();
  }
  size_t size() const { return events_.size(); }

 private:
  std::vector<std::shared_ptr<E>> events_;
  size_t cursor_ = 0;
};

}  // namespace specula
