#include "engine/generate/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

bool Scheduler::CanAdmit() const {
  return static_cast<int32_t>(running_.size()) < options_.max_running && !HasPreempted();
}

absl::Status Scheduler::CheckAdmission() const {
  if (CanAdmit()) return absl::OkStatus();
  if (static_cast<int32_t>(running_.size()) >= options_.max_running) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d sequences are running already (max_running)", running_.size()));
  }
  return absl::ResourceExhaustedError(
      "preempted sequences are waiting for KV cache; new ones start after them");
}

bool Scheduler::HasRoomFor(const GenerationRequest& request, int64_t total,
                           const KvManager& kv) const {
  return CanAdmit() && kv.HasRoomFor(request, total, Reserved());
}

absl::Status Scheduler::Admit(std::unique_ptr<Sequence> seq, KvManager& kv) {
  RETURN_IF_ERROR(CheckAdmission());
  RETURN_IF_ERROR(kv.Attach(*seq, /*resume=*/false));
  const uint64_t id = seq->id();
  running_.emplace(id, Running{std::move(seq), &kv});
  return absl::OkStatus();
}

bool Scheduler::HasPreempted() const {
  return std::any_of(running_.begin(), running_.end(),
                     [](const auto& e) { return e.second.seq->preempted(); });
}

KvRoom Scheduler::Reserved(const KvManager* kv) const {
  KvRoom room;
  for (const auto& [id, r] : running_) {
    if (r.seq->preempted() || (kv != nullptr && r.kv != kv)) continue;
    room += r.kv->Growth(*r.seq);
  }
  return room;
}

void Scheduler::MakeRoom(std::vector<SequenceOutput>* outputs) {
  ResumePreempted(outputs);
  for (KvManager* kv : managers_) Grow(*kv, outputs);
}

void Scheduler::ResumePreempted(std::vector<SequenceOutput>* outputs) {
  // Oldest first, and none behind one that does not fit: the oldest is never passed over.
  for (auto it = running_.begin(); it != running_.end();) {
    Running& r = it->second;
    Sequence& s = *r.seq;
    if (!s.preempted()) {
      ++it;
      continue;
    }
    // Room beyond what running sequences take this step, or it would be preempted again at once.
    if (!r.kv->HasRoomToResume(s, Reserved())) return;
    if (absl::Status attached = r.kv->Attach(s, /*resume=*/true); !attached.ok()) {
      // Room was there, so this is an allocation failure (a device buffer, an injected fault):
      // the sequence fails alone. Attach has given back what it took and closed its hit.
      outputs->push_back(FailedOutput(
          s, absl::Status(attached.code(),
                          absl::StrCat("resuming after preemption: ", attached.message()))));
      it = running_.erase(it);
      continue;
    }
    resumed_cached_tokens_ += s.kv_len();
    s.set_preempted(false);
    ++it;
  }
}

void Scheduler::Grow(KvManager& kv, std::vector<SequenceOutput>* outputs) {
  KvRoom need = Reserved(&kv);
  if (need.empty()) return;
  // Out of room: the youngest running sequences of this kind give theirs back (parked in the
  // prefix cache while nothing else needs the room) until the others can grow.
  bool room = kv.MakeRoom(need);
  for (auto it = running_.rbegin(); !room && it != running_.rend(); ++it) {
    Running& victim = it->second;
    if (victim.kv != &kv || victim.seq->preempted() || !kv.Preemptible(*victim.seq)) continue;
    Preempt(victim);
    need = Reserved(&kv);  // the victim may have been one of those growing
    room = kv.MakeRoom(need);
  }
  failed_.clear();
  for (auto& [id, r] : running_) {
    if (r.kv != &kv || r.seq->preempted() || kv.Growth(*r.seq).empty()) continue;
    if (absl::Status grown = kv.Grow(*r.seq); !grown.ok()) {
      // Not a lack of room (made above): an allocation failure.
      outputs->push_back(FailedOutput(*r.seq, std::move(grown)));
      failed_.push_back(id);
    }
  }
  for (uint64_t id : failed_) Retire(id, /*kv_valid=*/false);
}

void Scheduler::Preempt(Running& victim) {
  victim.kv->Park(*victim.seq);
  victim.seq->Preempt();
  ++preemptions_;
}

int64_t Scheduler::PrefillBudget() const {
  for (const auto& [id, r] : running_) {
    if (!r.seq->preempted() && !r.seq->in_prefill()) return options_.prefill_chunk_tokens;
  }
  return options_.solo_prefill_chunk_tokens > 0 ? options_.solo_prefill_chunk_tokens
                                                : options_.prefill_chunk_tokens;
}

void Scheduler::ChoosePrefills() {
  prefills_.clear();
  int64_t budget = PrefillBudget();
  for (auto& [id, r] : running_) {
    if (budget == 0) break;
    if (r.seq->preempted() || !r.seq->in_prefill()) continue;
    const int64_t n = r.kv->ChoosePrefill(*r.seq, budget, step_);
    if (n == 0) continue;  // it waits
    prefills_.emplace_back(&r, n);
    budget -= n;
  }
}

ScheduledStep& Scheduler::ChooseRows() {
  step_.Clear();
  ChoosePrefills();
  for (KvManager* kv : managers_) {
    for (auto& [id, r] : running_) {
      if (r.kv == kv && !r.seq->preempted() && !r.seq->in_prefill()) {
        kv->AddRow(*r.seq, 1, /*prefill=*/false, step_);
      }
    }
    for (auto& [r, n] : prefills_) {
      if (r->kv == kv) kv->AddRow(*r->seq, n, /*prefill=*/true, step_);
    }
  }
  return step_;
}

void Scheduler::PlanKv(StepPlan& plan) {
  for (KvManager* kv : managers_) kv->PlanStep(plan);
}

void Scheduler::EndKvStep(const ScheduledStep& step) {
  for (KvManager* kv : managers_) kv->EndStep(step);
}

void Scheduler::FinishKvStep(const ScheduledStep& step, SparseStepStats* stats) {
  for (KvManager* kv : managers_) kv->FinishStep(step, stats);
}

int64_t Scheduler::Advance(const ScheduledRow& row) {
  return running_.at(row.seq->id()).kv->Advance(row);
}

absl::flat_hash_set<uint64_t> Scheduler::FailOnStepErrors(std::vector<SequenceOutput>* outputs) {
  absl::flat_hash_set<uint64_t> failed;
  for (KvManager* kv : managers_) {
    const absl::Status error = kv->TakeStepError();
    if (error.ok()) continue;
    // Sequences of other kinds, and later requests, are untouched.
    for (auto& [id, r] : running_) {
      if (r.kv != kv || r.seq->preempted()) continue;
      outputs->push_back(FailedOutput(*r.seq, error));
      failed.insert(id);
    }
  }
  return failed;
}

SequenceOutput Scheduler::FailedOutput(const Sequence& seq, absl::Status error) const {
  SequenceOutput out;
  out.id = seq.id();
  out.error = std::move(error);
  out.kv_stats = FinalKvStats(seq);
  return out;
}

KvStats Scheduler::FinalKvStats(const Sequence& seq) const {
  return running_.at(seq.id()).kv->Stats(seq);
}

void Scheduler::Retire(uint64_t id, bool kv_valid) {
  auto it = running_.find(id);
  CHECK(it != running_.end());
  it->second.kv->Release(*it->second.seq, kv_valid);
  running_.erase(it);
}

Sequence* Scheduler::Find(uint64_t id) const {
  auto it = running_.find(id);
  return it == running_.end() ? nullptr : it->second.seq.get();
}

}  // namespace specula
