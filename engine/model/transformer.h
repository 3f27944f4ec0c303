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
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace specula {

struct ForwardBatch {
  std::vector<int32_t> tokens;     // new tokens, sequence by sequence
  std::vector<int32_t> positions;  // their positions in their sequences
  std::vector<AttentionSeq> seqs;  // how rows map to sequences and their KV
  std::vector<int32_t> blocks;     // concatenated block tables (AttentionSeq::block_begin)
  std::vector<int32_t> write_blocks;   // per token: block receiving its K/V
  std::vector<int32_t> write_offsets;  // per token: slot in that block
  std::vector<int32_t> logit_rows;     // rows whose logits are returned, in this order

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

  // Writes the batch's K/V into `kv` and returns logits [logit_rows.size(), vocab] row-major.
  // A batch whose metadata is inconsistent (lengths, block tables, offsets) is INVALID_ARGUMENT.
  absl::Status Forward(const ForwardBatch& batch, KvPool& kv, std::vector<float>* logits);

 private:
  Transformer(ModelConfig config, ModelWeights weights, Backend& backend);
  absl::Status ValidateBatch(const ForwardBatch& batch, const KvPool& kv) const;

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  std::vector<float> inv_freq_;
  int64_t workspace_tokens_ = 0;
  int64_t workspace_logit_rows_ = 0;
  DeviceBuffer workspace_;
};

}  // namespace specula
