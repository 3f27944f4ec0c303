// The CPU backend's sparse KV operations (engine/backend/sparse_ops.h): the reference semantics of
// the CUDA kernels in kernels/sparse.cu. Each (row, KV head) is independent (its own slot arrays),
// so the work is spread over the thread pool by (row, head). Slot states are read and written
// atomically: a copy stream's thread marks slots ready while the compute stream reads them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/common/check.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/dot.h"
#include "engine/cpu/radix_sort.h"
#include "engine/cpu/scratch.h"
#include "engine/cpu/top_pages.h"

namespace specula {
namespace {

// Handing a loop to the thread pool costs tens of microseconds (a futex wake and a context
// switch, more on a small VM), about what scoring or selecting one (row, KV head) costs at a
// 16K context. So scoring and selection spread their lists over threads only in chunks of
// roughly this much work (ThreadPool::ParallelFor's min_chunk; measured on a 2-vCPU VM: ~12 µs
// per 2^16 multiply-adds of quest bounds, ~20 µs to select from 1,024 candidates).
constexpr int64_t kScoreMultiplyAddsPerChunk = int64_t{1} << 18;
constexpr int64_t kSelectCandidatesPerChunk = 4096;

// ParallelFor's min_chunk for items of `work_per_item` each.
int64_t ItemsPerChunk(int64_t work_per_chunk, int64_t work_per_item) {
  return std::max<int64_t>(1, work_per_chunk / std::max<int64_t>(1, work_per_item));
}

// Each thread's selection scratch, reserved to its floor when the thread first selects, whatever
// it selects first (a mode, a victim search, a ranking): a later step never grows it, whichever
// of them a thread happens to meet first.
struct SelectScratch {
  std::vector<uint64_t> victims, radix;           // NextVictim
  std::vector<int32_t> staged;                    // StageTop's ranking
  std::vector<int32_t> ranked, selected, missed;  // Resolve
  std::vector<int32_t> corrective;                // Resolve under defer
};

SelectScratch& ThreadSelectScratch() {
  thread_local SelectScratch scratch = [] {
    SelectScratch s;
    ReserveScratch(s.victims, 1);
    ReserveScratch(s.radix, 1);
    ReserveScratch(s.staged, 1);
    ReserveScratch(s.ranked, 1);
    ReserveScratch(s.selected, 1);
    ReserveScratch(s.missed, 1);
    ReserveScratch(s.corrective, 1);
    ReserveTopPagesScratch();
    return s;
  }();
  return scratch;
}

int32_t LoadState(int32_t* state) {
  return std::atomic_ref<int32_t>(*state).load(std::memory_order_acquire);
}
void StoreState(int32_t* state, int32_t value) {
  std::atomic_ref<int32_t>(*state).store(value, std::memory_order_release);
}

// One (row, layer, KV head) of a sparse sequence (its arrays and slot layout, shared with the
// kernels) and the slot claims of one operation on it.
struct HeadState : SparseHead {
  using SparseHead::SparseHead;

  // Claims a cache slot for `page` (not mapped): a free slot (lowest index first), else the
  // least recently used ready slot stamped before `evict_before` (not used this step, not
  // predicted for a later one, no copy in flight; lowest index on ties). Maps the page to it as
  // loading with `new_stamp`. -1 when none. Every claim of one operation passes the same
  // `evict_before`.
  int32_t Claim(int32_t page, uint32_t evict_before, uint32_t new_stamp) {
    const int32_t victim = NextVictim(evict_before);
    if (victim < 0) return -1;
    if (slot_page[victim] >= 0) page_slot[slot_page[victim]] = -1;
    slot_page[victim] = page;
    page_slot[page] = victim;
    stamp[victim] = new_stamp;
    StoreState(&state[victim], kSlotLoading);
    return victim;
  }
  // The victims in claim order, computed once per operation from the slots as they are then
  // (as the CUDA kernel snapshots them): a claimed slot's new stamp is at least `evict_before`
  // and a touched one's too, so neither is eligible again, and the slots left keep their order.
  // A slot seen loading is never taken, even if its copy lands meanwhile. The snapshot's keys
  // (free slots, then ready ones by stamp; by index within each) are made in index order, so a
  // stable radix sort on the bits above the index orders them: the stamps of a cache's slots
  // are recent steps, whose high bytes agree, so two or three counting passes.
  int32_t NextVictim(uint32_t evict_before) {
    SelectScratch& scratch = ThreadSelectScratch();
    std::vector<uint64_t>& order = scratch.victims;
    if (!victims_built_) {
      CHECK_LT(seq.cache_slots, kVictimSlotLimit) << "the slot index is the key's low 24 bits";
      order.clear();
      for (int32_t j = 0; j < seq.cache_slots; ++j) {
        const int32_t s = LoadState(&state[j]);
        if (s == kSlotFree) {
          order.push_back(static_cast<uint64_t>(j));
        } else if (s == kSlotReady && stamp[j] < evict_before) {
          order.push_back((uint64_t{1} << 62) | (uint64_t{stamp[j]} << 24) | j);
        }
      }
      RadixSortByBits(order, /*lo_bit=*/24, /*hi_bit=*/63, scratch.radix);
      victims_built_ = true;
      victims_evict_before_ = evict_before;
      next_victim_ = 0;
    }
    CHECK_EQ(victims_evict_before_, evict_before) << "one eviction bound per operation";
    while (next_victim_ < order.size()) {
      const int32_t j = static_cast<int32_t>(order[next_victim_++] & (kVictimSlotLimit - 1));
      // Touched since (wanted by this operation): no longer a victim.
      if (LoadState(&state[j]) == kSlotFree || stamp[j] < evict_before) return j;
    }
    return -1;
  }

  // Marks a mapped page as wanted at `value` (never lowering its stamp).
  void Touch(int32_t page, uint32_t value) {
    const int32_t j = page_slot[page];
    if (j >= 0) stamp[j] = std::max(stamp[j], value);
  }

 private:
  static constexpr int32_t kVictimSlotLimit = 1 << 24;
  bool victims_built_ = false;
  uint32_t victims_evict_before_ = 0;
  size_t next_victim_ = 0;
};

// Appends staged copies of (row, head) for a copy stream: claims a slot per page not mapped.
struct Stager {
  HeadState& hs;
  const PagePoolView& device_pool;
  const PagePoolView& host_pool;
  PageGatherEntry* entries;  // this list's
  int32_t* count;
  int32_t capacity;
  int64_t* counters;

  // False when no slot could be claimed (every slot is in use this step or loading).
  bool Stage(int32_t page, uint32_t evict_before, uint32_t new_stamp) {
    if (hs.page_slot[page] >= 0) {
      hs.Touch(page, new_stamp);
      return true;
    }
    CHECK_LT(*count, capacity) << "staging list overflow";
    const int32_t j = hs.Claim(page, evict_before, new_stamp);
    if (j < 0) return false;
    entries[(*count)++] =
        PageGatherEntry{host_pool.page(hs.host_pages[page]),
                        device_pool.page(hs.PoolPage(hs.CacheSlot(j))), &hs.state[j]};
    ++counters[kCounterStaged];
    return true;
  }
};

// Pages [S, S + candidates) ranked: the top `k` candidates best first. When the budget covers
// every candidate there are no scores (ScorePages skips the row): all of them, in position order.
// With `ranked_from` > 0 only the entries from there on are in rank order (the first ones are
// the best `ranked_from`, in any order): a resolve needs its selection as a set and only the
// pages below the cut in order.
void RankCandidates(const SparseRowPlan& row, int32_t head, absl::Span<const float> scores,
                    int32_t k, std::vector<int32_t>* out, int32_t ranked_from = 0) {
  const int32_t n = row.candidates;
  if (n <= row.seq.budget_pages) {
    out->resize(n);
    for (int32_t i = 0; i < n; ++i) (*out)[i] = i;
  } else {
    const absl::Span<const float> s =
        scores.subspan(static_cast<size_t>(row.score_begin) + head * n, n);
    if (ranked_from > 0) {
      PartitionTopPages(s, ranked_from, k, out);
    } else {
      RankTopPages(s, k, out);
    }
  }
  for (int32_t& i : *out) i += row.seq.sink_pages;
}

template <typename T>
void SummarizeKeys(const T* page, int32_t tokens, int32_t hd, float* summary) {
  float* mn = summary;
  float* mx = summary + hd;
  for (int32_t c = 0; c < hd; ++c) mn[c] = mx[c] = ToF32(page[c]);
  for (int32_t t = 1; t < tokens; ++t) {
    const T* k = page + static_cast<size_t>(t) * hd;
    for (int32_t c = 0; c < hd; ++c) {
      const float x = ToF32(k[c]);
      mn[c] = std::min(mn[c], x);
      mx[c] = std::max(mx[c], x);
    }
  }
}

// Quest's bound for one page, the max over the GQA group's heads of Σ_c max(q_c·min_c, q_c·max_c).
// Per channel that max is exactly min(q_c,0)·min_c + max(q_c,0)·max_c for finite keys (one of
// the two products is ±0; an infinite key would give 0·inf = NaN here, but it already makes
// attention's own scores non-finite), so with the group's queries split once per (row, head) by
// SplitQuestQueries, the bound is one dot product of length 2·head_dim with the summary [min |
// max]. In 8 lanes added as a tree, GCC vectorizes it at -O2 (the max form stayed scalar): scoring
// reads every candidate page at every layer.
void SplitQuestQueries(const float* queries, int32_t group, int32_t hd, std::vector<float>* out) {
  out->resize(static_cast<size_t>(group) * 2 * hd);
  for (int32_t g = 0; g < group; ++g) {
    const float* q = queries + static_cast<size_t>(g) * hd;
    float* neg = out->data() + static_cast<size_t>(g) * 2 * hd;
    float* pos = neg + hd;
    for (int32_t c = 0; c < hd; ++c) {
      neg[c] = std::min(q[c], 0.0f);
      pos[c] = std::max(q[c], 0.0f);
    }
  }
}

float QuestScore(const float* split, int32_t group, int32_t hd, const float* summary) {
  float best = -std::numeric_limits<float>::infinity();
  const int32_t n = 2 * hd;
  const int32_t vec = n / 8 * 8;
  for (int32_t g = 0; g < group; ++g) {
    const float* q = split + static_cast<size_t>(g) * n;
    float lane[8] = {};
    for (int32_t c = 0; c < vec; c += 8) {
      for (int32_t i = 0; i < 8; ++i) lane[i] += q[c + i] * summary[c + i];
    }
    float bound =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (int32_t c = vec; c < n; ++c) bound += q[c] * summary[c];
    best = std::max(best, bound);
  }
  return best;
}

// The true max of q·k over the page's keys and the group's heads.
template <typename T>
float ExactScore(const float* queries, int32_t group, int32_t hd, int32_t tokens, const T* keys) {
  float best = -std::numeric_limits<float>::infinity();
  for (int32_t t = 0; t < tokens; ++t) {
    const T* k = keys + static_cast<size_t>(t) * hd;
    for (int32_t g = 0; g < group; ++g) {
      best = std::max(best, Dot(queries + static_cast<size_t>(g) * hd, k, hd));
    }
  }
  return best;
}

// The buffers of a SelectPages operation, on the host (unused ones empty).
struct SelectBuffers {
  absl::Span<const float> scores;
  absl::Span<int64_t> counters;
  absl::Span<int32_t> list_pages, list_tokens, list_count;  // kResolve
  absl::Span<PageGatherEntry> copies;                       // kResolve, kStage
  absl::Span<int32_t> copy_count;
};

// One (row, KV head) list of a SelectPages operation.
struct SelectList {
  const SparseSelectArgs& args;
  const SelectBuffers& buffers;
  const SparseRowPlan& row;
  HeadState& hs;
  int64_t list;    // row * kv_heads + head
  int64_t* count;  // its counters

  // Where this list's staged copies go; the list is rewritten whole by each operation.
  Stager MakeStager() const {
    Stager stager{hs,
                  args.device_pool,
                  args.host_pool,
                  buffers.copies.data() + list * args.staging.copy_stride,
                  &buffers.copy_count[list],
                  args.staging.copy_stride,
                  count};
    *stager.count = 0;
    return stager;
  }
};

// kLoadNow: every candidate not resident is copied into a cache slot now and marked ready.
void LoadNow(const SelectList& l) {
  const SparseRowPlan& row = l.row;
  const PagePoolView& device = l.args.device_pool;
  const PagePoolView& host = l.args.host_pool;
  const int32_t S = row.seq.sink_pages;
  for (int32_t p = S; p < S + row.candidates; ++p) {
    if (l.hs.page_slot[p] >= 0) continue;
    const int32_t j = l.hs.Claim(p, PredictStamp(row.step + 1), PredictStamp(row.step + 1));
    if (j < 0) break;
    std::memcpy(device.page(l.hs.PoolPage(l.hs.CacheSlot(j))), host.page(l.hs.host_pages[p]),
                host.page_bytes());
    StoreState(&l.hs.state[j], kSlotReady);
    ++l.count[kCounterFetched];
  }
}

// kStage: the top C candidates are staged, for this step (urgent: cross_layer) or the next.
void StageTop(const SelectList& l) {
  std::vector<int32_t>& ranked = ThreadSelectScratch().staged;
  const SparseRowPlan& row = l.row;
  Stager stager = l.MakeStager();
  const uint32_t stamp = l.args.urgent ? UseStamp(row.step) : PredictStamp(row.step + 1);
  ReserveScratch(ranked, static_cast<size_t>(row.seq.cache_slots));
  RankCandidates(row, l.hs.head, l.buffers.scores, row.seq.cache_slots, &ranked);
  for (int32_t p : ranked) l.hs.Touch(p, stamp);  // staging the others cannot evict these
  for (int32_t p : ranked) {
    if (!stager.Stage(p, stamp, stamp)) break;
  }
}

// Whether defer corrects a miss of `page`: every miss when the budget covers every candidate
// (nothing was ranked), else those among the best `correct_pages` (`corrective`, sorted).
bool Corrects(const SparseRowPlan& row, const std::vector<int32_t>& corrective, int32_t page) {
  if (row.correct_pages == 0) return false;
  if (row.candidates <= row.seq.budget_pages) return true;
  return std::binary_search(corrective.begin(), corrective.end(), page);
}

// kResolve, one list: the attend list (sinks, the selected pages in position order, the window)
// with each selected page classified; returns the selected pages that were not resident.
// `corrective` (sorted) holds the pages whose miss defer corrects; all of them when empty and
// every candidate is taken.
void WriteAttendList(const SelectList& l, const std::vector<int32_t>& selected,
                     const std::vector<int32_t>& corrective, std::vector<int32_t>* missed) {
  const SparseRowPlan& row = l.row;
  const HeadState& hs = l.hs;
  const int32_t ps = l.args.page_size;
  const int32_t S = row.seq.sink_pages;
  const int32_t current = row.pos / ps;
  const int32_t current_tokens = row.pos % ps + 1;
  const int64_t at = row.list_begin + static_cast<int64_t>(hs.head) * row.list_capacity;
  int32_t n = 0;
  auto add = [&](int64_t ref, int32_t page) {
    CHECK_LT(n, row.list_capacity) << "attend list overflow";
    l.buffers.list_pages[at + n] = static_cast<int32_t>(ref);
    l.buffers.list_tokens[at + n] = page == current ? current_tokens : ps;
    ++n;
  };
  for (int32_t p = 0; p < std::min(S, current + 1); ++p) add(hs.PoolPage(p), p);
  missed->clear();
  for (int32_t p : selected) {
    const int32_t j = hs.page_slot[p];
    const int32_t state = j >= 0 ? LoadState(&hs.state[j]) : kSlotFree;
    if (state == kSlotReady) {
      ++l.count[kCounterHit];
      add(hs.PoolPage(hs.CacheSlot(j)), p);
      continue;
    }
    if (j >= 0) {
      ++l.count[kCounterLate];  // its copy is on the way
    } else {
      ++l.count[kCounterMissed];
      missed->push_back(p);
    }
    if (l.args.defer_missing) {
      // Late: its slot, once the copy has landed (the caller waits). Missing: left out for
      // this step, unless it ranks high enough to be corrected (read from the host now).
      if (j >= 0) {
        add(hs.PoolPage(hs.CacheSlot(j)), p);
        continue;
      }
      if (!Corrects(row, corrective, p)) continue;
      ++l.count[kCounterCorrected];
    }
    ++l.count[kCounterFetched];
    add(HostPageRef(hs.host_pages[p]), p);
  }
  for (int32_t p = S + row.candidates; p <= current; ++p) add(hs.PoolPage(hs.RingSlot(p)), p);
  l.buffers.list_count[l.list] = n;
}

// kResolve: this step's pages (the top B), their attend list, and for the next step the misses
// and (stage_ranked: cross_step) the pages ranked just below the cut.
void Resolve(const SelectList& l) {
  SelectScratch& scratch = ThreadSelectScratch();
  std::vector<int32_t>& ranked = scratch.ranked;
  std::vector<int32_t>& selected = scratch.selected;
  std::vector<int32_t>& missed = scratch.missed;
  std::vector<int32_t>& corrective = scratch.corrective;
  const SparseRowPlan& row = l.row;
  const int32_t B = row.seq.budget_pages;
  Stager stager = l.MakeStager();
  const uint32_t use = UseStamp(row.step);
  const uint32_t next = PredictStamp(row.step + 1);
  // Bounded by the cache's slots: a floor's worth each, so they do not grow step by step.
  ReserveScratch(ranked, static_cast<size_t>(row.seq.cache_slots));
  ReserveScratch(selected, static_cast<size_t>(B));
  ReserveScratch(missed, static_cast<size_t>(B));
  ReserveScratch(corrective, static_cast<size_t>(B));
  // The best correct_pages first (as a set) when defer corrects misses, else the best B.
  const int32_t K = l.args.defer_missing ? std::min(row.correct_pages, B) : 0;
  RankCandidates(row, l.hs.head, l.buffers.scores, l.args.stage_ranked ? row.seq.cache_slots : B,
                 &ranked, K > 0 ? K : B);
  selected.assign(ranked.begin(), ranked.begin() + std::min<size_t>(B, ranked.size()));
  corrective.assign(ranked.begin(), ranked.begin() + std::min<size_t>(K, ranked.size()));
  const int32_t S = row.seq.sink_pages;
  SortPageSet(selected, S, S + row.candidates);
  SortPageSet(corrective, S, S + row.candidates);
  for (int32_t p : selected) l.hs.Touch(p, use);  // staging below cannot evict them
  WriteAttendList(l, selected, corrective, &missed);
  bool room = true;
  for (int32_t p : missed) {
    if (!(room = stager.Stage(p, use, next))) break;
  }
  for (size_t i = selected.size(); room && i < ranked.size(); ++i) {
    room = stager.Stage(ranked[i], use, next);
  }
}

}  // namespace

void CpuBackend::ScorePages(const Mat& q, const SparseScoreArgs& a) {
  const absl::Span<const SparseRowPlan> rows = Host(a.rows);
  const absl::Span<float> scores = Host(a.scores);
  const int32_t hd = a.host_pool.head_dim;
  const int32_t group = a.num_heads / a.num_kv_heads;
  CHECK(a.scoring == PageScoring::kExact || a.summaries != nullptr);
  const int64_t per_page = static_cast<int64_t>(group) * hd *
                           (a.scoring == PageScoring::kQuest ? 2 : a.host_pool.page_size);
  pool_.ParallelFor(
      static_cast<int64_t>(rows.size()) * a.num_kv_heads,
      ItemsPerChunk(kScoreMultiplyAddsPerChunk, per_page * a.max_candidates),
      [&](int64_t begin, int64_t end) {
        // Each thread's, kept across calls (floor-sized: a steady step allocates nothing here).
        thread_local std::vector<float> split;
        ReserveScratch(split, static_cast<size_t>(group) * 2 * hd);
        for (int64_t task = begin; task < end; ++task) {
          const SparseRowPlan& row = rows[task / a.num_kv_heads];
          const int32_t h = static_cast<int32_t>(task % a.num_kv_heads);
          if (row.candidates <= row.seq.budget_pages) continue;  // all taken: nothing to rank
          const HeadState hs(row, a.layer, h, a.num_kv_heads);
          const float* queries =
              q.row(row.q_row - a.q_first_row) + static_cast<int64_t>(h) * group * hd;
          float* out = scores.data() + row.score_begin + static_cast<int64_t>(h) * row.candidates;
          if (a.scoring == PageScoring::kQuest) SplitQuestQueries(queries, group, hd, &split);
          for (int32_t i = 0; i < row.candidates; ++i) {
            const int32_t page = hs.host_pages[row.seq.sink_pages + i];
            if (a.scoring == PageScoring::kQuest) {
              out[i] = QuestScore(split.data(), group, hd,
                                  a.summaries + static_cast<size_t>(page) * 2 * hd);
            } else {
              out[i] = VisitDType(a.host_pool.dtype, [&](auto tag) {
                using T = decltype(tag);
                return ExactScore(queries, group, hd, a.host_pool.page_size,
                                  static_cast<const T*>(a.host_pool.page(page)));
              });
            }
          }
        }
      });
}

void CpuBackend::SelectPages(const SparseSelectArgs& a) {
  const absl::Span<const SparseRowPlan> rows = Host(a.rows);
  SelectBuffers buffers;
  buffers.scores = a.scores.empty() ? absl::Span<const float>() : Host(a.scores);
  buffers.counters = Host(a.counters);
  if (a.mode == SelectMode::kResolve) {
    buffers.list_pages = Host(a.list_pages);
    buffers.list_tokens = Host(a.list_tokens);
    buffers.list_count = Host(a.list_count);
  }
  if (a.mode != SelectMode::kLoadNow) {
    buffers.copies = Host(a.staging.copies);
    buffers.copy_count = Host(a.staging.copy_count);
  }
  const int32_t kv_heads = a.num_kv_heads;
  int32_t max_candidates = 0;
  for (const SparseRowPlan& row : rows) max_candidates = std::max(max_candidates, row.candidates);
  pool_.ParallelFor(
      static_cast<int64_t>(rows.size()) * kv_heads,
      ItemsPerChunk(kSelectCandidatesPerChunk, max_candidates), [&](int64_t begin, int64_t end) {
        (void)ThreadSelectScratch();  // reserved on this thread's first selection of any kind
        for (int64_t list = begin; list < end; ++list) {
          const SparseRowPlan& row = rows[list / kv_heads];
          HeadState hs(row, a.layer, static_cast<int32_t>(list % kv_heads), kv_heads);
          SelectList l{a,  buffers, row,
                       hs, list,    buffers.counters.data() + list * kSparseCounterCount};
          switch (a.mode) {
            case SelectMode::kLoadNow:
              LoadNow(l);
              break;
            case SelectMode::kStage:
              StageTop(l);
              break;
            case SelectMode::kResolve:
              Resolve(l);
              break;
          }
        }
      });
}

void CpuBackend::RetireWindowPages(const SparseRetireArgs& a) {
  const absl::Span<const SparseRowPlan> rows = Host(a.rows);
  pool_.ParallelFor(
      static_cast<int64_t>(rows.size()) * a.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t list = begin; list < end; ++list) {
          const SparseRowPlan& row = rows[list / a.num_kv_heads];
          if (row.retire_begin >= row.retire_end) continue;
          HeadState hs(row, a.layer, static_cast<int32_t>(list % a.num_kv_heads), a.num_kv_heads);
          // Never evict a page the previous step used or one staged for this step.
          const uint32_t previous = UseStamp(row.step - 1);
          for (int32_t p = row.retire_begin; p < row.retire_end; ++p) {
            if (hs.page_slot[p] >= 0) continue;  // staged from the host already
            const int32_t j = hs.Claim(p, previous, previous);
            if (j < 0) continue;  // it stays in the host store; a miss if it is ever selected
            std::memcpy(a.device_pool.page(hs.PoolPage(hs.CacheSlot(j))),
                        a.device_pool.page(hs.PoolPage(hs.RingSlot(p))),
                        a.device_pool.page_bytes());
            StoreState(&hs.state[j], kSlotReady);
          }
        }
      });
}

void CpuBackend::CompletePages(const SparseCompleteArgs& a) {
  const absl::Span<const SparseRowPlan> rows = Host(a.rows);
  const int32_t hd = a.host_pool.head_dim;
  const int32_t ps = a.host_pool.page_size;
  pool_.ParallelFor(
      static_cast<int64_t>(rows.size()) * a.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t list = begin; list < end; ++list) {
          const SparseRowPlan& row = rows[list / a.num_kv_heads];
          if (!row.completes_page) continue;
          const HeadState hs(row, a.layer, static_cast<int32_t>(list % a.num_kv_heads),
                             a.num_kv_heads);
          const int32_t page = row.pos / ps;
          const int32_t host_page = hs.host_pages[page];
          void* dst = a.host_pool.page(host_page);
          std::memcpy(dst, a.device_pool.page(hs.PoolPage(hs.WriteSlot(page))),
                      a.host_pool.page_bytes());
          if (a.summaries == nullptr) continue;
          VisitDType(a.host_pool.dtype, [&](auto tag) {
            SummarizeKeys(static_cast<const decltype(tag)*>(dst), ps, hd,
                          a.summaries + static_cast<size_t>(host_page) * 2 * hd);
          });
        }
      });
}

void CpuBackend::SummarizePages(const PageSummaryArgs& a) {
  const absl::Span<const int32_t> src = Host(a.src);
  const absl::Span<const int32_t> dst = Host(a.dst);
  CHECK_EQ(src.size(), dst.size());
  const int32_t hd = a.pool.head_dim;
  pool_.ParallelFor(static_cast<int64_t>(src.size()), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      VisitDType(a.pool.dtype, [&](auto tag) {
        SummarizeKeys(static_cast<const decltype(tag)*>(a.pool.page(src[i])), a.pool.page_size, hd,
                      a.summaries + static_cast<size_t>(dst[i]) * 2 * hd);
      });
    }
  });
}

void CpuBackend::GatherPages(Stream& stream, const PageGatherArgs& a) {
  auto* copy = dynamic_cast<CpuCopyStream*>(&stream);
  CHECK(copy != nullptr) << "GatherPages runs on a copy stream from CreateStream()";
  // Like a kernel, it reads the lists when it runs, not when it is enqueued.
  const absl::Span<const PageGatherEntry> copies = Host(a.copies);
  const absl::Span<const int32_t> counts = Host(a.copy_count);
  CHECK(counts.size() >= static_cast<size_t>(a.lists));
  copy->Launch([copies, counts, lists = a.lists, stride = a.copy_stride, bytes = a.page_bytes,
                gathered = a.pages_gathered] {
    int32_t total = 0;
    for (int32_t list = 0; list < lists; ++list) {
      const int32_t n = counts[list];  // written before the event this stream waited on
      for (int32_t e = 0; e < n; ++e) {
        const PageGatherEntry& c = copies[static_cast<size_t>(list) * stride + e];
        std::memcpy(c.dst, c.src, bytes);
        StoreState(c.state, kSlotReady);
      }
      total += n;
    }
    if (gathered != nullptr) *gathered = total;
  });
}

}  // namespace specula
