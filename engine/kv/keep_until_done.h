// Memory that copies on other streams may still read or write, kept alive until their events
// are done, so freeing it never needs a host wait: a replaced staging buffer (gathers may still
// read its lists), a released sparse working set (gathers may still fill its slots and state).
//
// Engine thread only.
#pragma once

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "engine/backend/stream.h"

namespace specula {

class KeepUntilDone {
 public:
  // Keeps `what` until every event in `events` is done.
  void Add(std::shared_ptr<void> what, std::vector<std::shared_ptr<Event>> events) {
    kept_.push_back({std::move(what), std::move(events)});
  }
  // Lets go of what is no longer touched; with `wait`, first waits for the rest (a host
  // synchronization, counted by the backend).
  void Reap(bool wait) {
    auto untouched = [wait](const Kept& k) {
      for (const std::shared_ptr<Event>& e : k.events) {
        if (e->Done()) continue;
        if (!wait) return false;
        e->Synchronize();
      }
      return true;
    };
    kept_.erase(std::remove_if(kept_.begin(), kept_.end(), untouched), kept_.end());
  }
  bool empty() const { return kept_.empty(); }

 private:
  struct Kept {
    std::shared_ptr<void> what;
    std::vector<std::shared_ptr<Event>> events;
  };
  std::vector<Kept> kept_;
};

}  // namespace specula
