// The decoder-only transformer forward pass (Llama, Mistral, Qwen2, Qwen3), written once against
// the Backend interface. One Forward call runs a batch of new tokens from several sequences
// (prefill chunks and decode tokens mixed) through every layer and returns the logits of the
// rows that need sampling.
//
// Owned and called by one engine thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/sparse_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace specula {

// Rows come in three runs: dense sequences (KV in the device pool), then sparse decode rows,
// then sparse sequences in prefill (KV in the sparse cache). Decode before prefill as in the
// dense run, so an all-sparse batch has the same row order as the same batch run dense.
struct ForwardBatch {
  std::vector<int32_t> tokens;     // new tokens, sequence by sequence
  std::vector<int32_t> positions;  // their positions in their sequences
  std::vector<AttentionSeq> seqs;  // how the dense rows map to sequences and their KV
  std::vector<int32_t> blocks;     // concatenated block tables (AttentionSeq::block_begin)
  std::vector<int32_t> write_blocks;   // per dense row: block receiving its K/V
  std::vector<int32_t> write_offsets;  // per dense row: slot in that block
  std::vector<SparseRows> sparse_decode;   // after the dense rows, one row each
  std::vector<SparseRows> sparse_prefill;  // last
  std::vector<int32_t> logit_rows;     // rows whose logits are returned, in this order

  int64_t dense_rows() const { return static_cast<int64_t>(write_blocks.size()); }

  void Clear();
};

class Transformer {
 public:
  // Reads config.json and the safetensors weights of `model_dir` onto `backend`, which must
  // outlive the Transformer.
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& model_dir,
                                                           Backend& backend);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }

  // Sizes the scratch memory for batches of up to `tokens` rows and `logit_rows` logit rows, so
  // that Forward on such batches never allocates (and so never fails for memory mid-request).
  absl::Status Reserve(int64_t tokens, int64_t logit_rows);

  // Writes the batch's K/V into `kv` (dense rows) and `sparse` (sparse rows; may be null when
  // there are none) and returns logits [logit_rows.size(), vocab] row-major. A batch whose
  // metadata is inconsistent (lengths, block tables, offsets) is INVALID_ARGUMENT.
  absl::Status Forward(const ForwardBatch& batch, KvPool& kv, SparseKvCache* sparse,
                       std::vector<float>* logits);

 private:
  Transformer(ModelConfig config, ModelWeights weights, Backend& backend);
  absl::Status ValidateBatch(const ForwardBatch& batch, const KvPool& kv,
                             const SparseKvCache* sparse) const;
  // cross_layer speculation: layer `next`'s queries from layer `next - 1`'s input `x`, for the
  // sparse decode rows, handed to the prefetch executor.
  void PredictSparseLayer(int64_t next, const ForwardBatch& batch, const Mat& x, Mat scratch_h,
                          Mat scratch_qkv, SparseKvCache& sparse);

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  std::vector<float> inv_freq_;
  int64_t workspace_tokens_ = 0;
  int64_t workspace_logit_rows_ = 0;
  DeviceBuffer workspace_;
};

}  // namespace specula
