#include "engine/generate/mask_preparer.h"

#include <utility>

#include "engine/common/fault_injection.h"
#include "engine/common/log.h"

namespace specula {

MaskPreparer::MaskPreparer(const grammar::TokenTable& table, grammar::SharedMaskEntries* shared,
                           MaskCaches& caches, int threads, std::chrono::milliseconds budget)
    : caches_(caches), masker_(table, {.threads = threads, .shared = shared}), budget_(budget) {}

MaskPreparer::~MaskPreparer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cancel_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Grammars still queued are left claimed: nothing admits requests once the engine is gone.
}

void MaskPreparer::Request(const std::shared_ptr<const grammar::Grammar>& g, bool awaited) {
  if (g == nullptr) return;
  {
    std::lock_guard lock(mu_);
    if (stop_ || awaited_.size() + later_.size() >= kMaxQueued) return;
    if (!caches_.StartPreparing(g)) return;
    (awaited ? awaited_ : later_).push_back(g);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
}

void MaskPreparer::SetOnPrepared(std::function<void()> on_prepared) {
  std::lock_guard lock(on_prepared_mu_);
  on_prepared_ = std::move(on_prepared);
}

void MaskPreparer::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !awaited_.empty() || !later_.empty(); });
    if (stop_) return;
    auto& queue = !awaited_.empty() ? awaited_ : later_;
    std::shared_ptr<const grammar::Grammar> g = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    PrepareOne(g);
    g.reset();
    lock.lock();
  }
}

void MaskPreparer::PrepareOne(const std::shared_ptr<const grammar::Grammar>& g) {
  const auto start = std::chrono::steady_clock::now();
  auto cache = std::make_shared<grammar::MaskCache>();
  SPECULA_FAULT(Fault::kSlowMaskPreparation);
  const int entries = masker_.Prepare(*g, cache.get(), start + budget_, &cancel_);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const int64_t walks = cache->walks(), costly = cache->costly_walks();
  caches_.FinishPreparing(g.get(), std::move(cache));
  // Once per schema: what its first request waited for in the queue.
  Log(LogLevel::kInfo, "mask_cache_prepared",
      {{"entries", entries}, {"walks", walks}, {"costly_walks", costly}, {"ms", ms}});
  std::lock_guard lock(on_prepared_mu_);
  if (on_prepared_) on_prepared_();
}

}  // namespace specula
