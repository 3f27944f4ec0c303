// Layer-major prefill of one sparse sequence (DESIGN.md §3): layer 0 over the whole prompt,
// chunk by chunk, then layer 1, and so on. A layer's K/V for the whole prompt stays on the device
// (one layer's worth, not the model's) while its chunks attend causally to it; when the layer is
// done, its pages are written to the host store once, summarized on the device, the sinks and
// the recent window are loaded into the sequence's slots, and the pages the first decode step
// will want are staged (the last prompt row's query, cross_step) or loaded (when the budget
// covers every candidate). The prompt's hidden states stay on the device between layers.
//
// Why: token-major chunks would re-read all earlier KV of every layer from host memory for each
// chunk (quadratic bus traffic) or need the whole prompt's KV on the device. This moves the
// prompt's KV over the bus exactly once, and needs one layer's KV on the device.
//
// A cached prefix (session, shared system prompt) is not recomputed: its pages are loaded from
// the host store into the layer buffer for the new chunks to attend to.
//
// Engine thread only. Runs between the step's batched forward pass and its readback, in units
// of (layer, chunk) so decode steps of other requests go on between them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/kv/decode_start.h"
#include "engine/kv/sparse_kv_cache.h"
#include "engine/model/kv_attention.h"
#include "engine/model/transformer.h"

namespace specula {

class SparsePrefill {
 public:
  // Prefills `prompt` tokens [start, prompt.size()) of `ws` (start: the cached prefix, whole
  // pages) in chunks of at most `chunk_tokens` rows. Allocates the prompt's hidden states and
  // one layer's KV for the whole prompt: RESOURCE_EXHAUSTED when they do not fit.
  static absl::StatusOr<std::unique_ptr<SparsePrefill>> Create(Transformer& model,
                                                               SparseKvCache& cache, WorkingSet& ws,
                                                               std::vector<int32_t> prompt,
                                                               int64_t start, int32_t chunk_tokens);
  ~SparsePrefill();

  // Plans this step's units: up to `layer_tokens` rows summed over (layer, chunk) units (at
  // least one unit). Call before plan.Upload(); then Bind after it, then Run.
  absl::Status Plan(int64_t layer_tokens, StepPlan& plan);
  void Bind(const StepPlan& plan);
  // Enqueues the planned units. When the last layer is done, the last prompt row's logits go
  // to logit row `logit_row` (done() is then true).
  void Run(int64_t logit_row);
  // After the step's synchronization: the counters of the layer ends (pages loaded or staged)
  // into the request's stats and `step`.
  void FinishStep(SparseStepStats* step);
  // Enqueues the counters' readback.
  void EndStep() { decode_start_.EndStep(); }

  bool done() const { return next_layer_ >= layers_; }
  // Whether this step's plan finishes the prompt (its logits row is needed).
  bool finishes_this_step() const { return finishes_; }
  int64_t prompt_tokens() const { return static_cast<int64_t>(prompt_.size()); }
  WorkingSet& ws() { return ws_; }

 private:
  class LayerKv;
  struct Unit {
    int32_t layer = 0;
    int64_t begin = 0;  // prompt positions [begin, end)
    int64_t end = 0;
    PlanSlice<int32_t> tokens, positions, write_blocks, write_offsets, row_keys, row_begin,
        seq_rows;
  };
  SparsePrefill(Transformer& model, SparseKvCache& cache, WorkingSet& ws,
                std::vector<int32_t> prompt, int64_t start, int32_t chunk_tokens);
  // When a layer is done: its new pages to the host store, then DecodeStart.
  void EndLayer(int32_t layer, const Mat& last_query);
  // Copies of pages of the layer buffer (one per page and KV head) from or to the host store.
  void CopyLayerPages(int32_t layer, int32_t first_page, int32_t end_page, bool to_host);

  Transformer& model_;
  SparseKvCache& cache_;
  Backend& backend_;
  WorkingSet& ws_;
  std::vector<int32_t> prompt_;
  int64_t start_;
  int32_t chunk_tokens_;
  int32_t layers_;
  int32_t pages_;        // pages holding prompt tokens
  DeviceBuffer hidden_;  // [prompt - start, hidden] fp32
  DeviceBuffer
      layer_kv_;  // one layer's pages for the whole prompt: page p of head h at p * kv_heads + h
  KvLayerView layer_view_;
  int32_t next_layer_ = 0;
  int64_t next_begin_;           // first position of the next unit
  std::vector<Unit> units_;      // this step's
  PlanSlice<int32_t> identity_;  // block table 0, 1, ..., pages - 1
  PlanSlice<int32_t> last_row_;  // {the last prompt row's index in hidden_}
  std::unique_ptr<LayerKv> attention_;
  DecodeStart decode_start_;
  bool finishes_ = false;
  const StepPlan* plan_ = nullptr;
};

}  // namespace specula
