// Page selection for the sparse KV cache (docs/ARCHITECTURE.md §4): a selector keeps a small
// summary (the "selection index") of every host page's keys and scores pages against the current
// queries, so the working set can fetch only the most important pages of each (layer, KV head).
//
// GQA rule: the query heads that share one KV head (a "group") score that head's pages together.
// A page's score is the MAXIMUM over the group's query heads of the per-head score, so a page that
// any one head needs ranks high and is kept; summing or averaging would let heads that ignore the
// page outvote the one that needs it.
//
// Threading: a selector does no locking. Summarize(page) must happen-before any Score that
// includes that page, and Summarize calls for one page must not overlap; Score calls (const) may
// run concurrently with each other and with Summarize of other pages. The working-set code owns
// this ordering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/host_kv_store.h"

namespace specula {

class PageSelector {
 public:
  virtual ~PageSelector() = default;

  virtual std::string_view name() const = 0;

  // Records the summary of `page` from its first `tokens` keys, `k` = [tokens][head_dim]
  // (1 <= tokens <= page_size). Called when a page's K is complete, and again (with the same
  // page and more tokens) while a partial page grows; each call replaces the previous summary,
  // so a page reused after release needs no separate reset.
  virtual void Summarize(PageId page, const float* k, int32_t tokens) = 0;

  // scores[i] = importance of pages[i] for the query heads of one GQA group:
  // `queries` = [group][head_dim] (the group's query rows, already RoPE'd like the keys).
  // Higher = more important; scores are comparable across the pages of one call, not across
  // selectors. Every page must have been summarized. scores.size() == pages.size().
  virtual void Score(absl::Span<const float> queries, int32_t group, absl::Span<const PageId> pages,
                     absl::Span<float> scores) const = 0;

  // Bytes of summary per page that scoring reads (what a device-resident index costs), to report
  // the index size as a fraction of K.
  virtual size_t index_bytes_per_page() const = 0;
};

// "quest" (the default; per-channel min/max bound) or "exact" (true q·k, the oracle).
// INVALID_ARGUMENT listing the accepted names otherwise. The selector keeps a reference to
// `store`, which must outlive it.
absl::StatusOr<std::unique_ptr<PageSelector>> MakePageSelector(std::string_view name,
                                                               const HostKvStore& store);

}  // namespace specula
