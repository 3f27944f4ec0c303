#include "engine/generate/mask_worker.h"

#include "engine/common/check.h"

namespace specula {

MaskWorker::~MaskWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MaskWorker::Start(const std::vector<OutputConstraint*>& constraints) {
  if (constraints.empty()) return;
  {
    std::lock_guard lock(mu_);
    CHECK(!pending_);
    batch_.assign(constraints.begin(), constraints.end());
    pending_ = true;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();
}

void MaskWorker::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return !pending_; });
}

void MaskWorker::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || pending_; });
    if (stop_) return;
    lock.unlock();  // Start writes batch_ only once this batch is done
    for (OutputConstraint* c : batch_) c->PrepareMask(masker_);
    lock.lock();
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace specula
