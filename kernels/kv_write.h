// Appends new tokens' K and V to paged KV (the layout of engine/backend/backend.h's KvLayerView):
// token t's K/V for KV head h goes to page blocks[t] * num_kv_heads + h, row offsets[t], rounded to
// the page dtype (nearest even).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/elementwise.h"

namespace specula::kernels {

struct KvWriteParams {
  Rows k;  // [tokens, num_kv_heads * head_dim]
  Rows v;
  const int32_t* blocks = nullptr;   // per token
  const int32_t* offsets = nullptr;  // per token
  void* base = nullptr;
  DType dtype = DType::kF32;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;
  int32_t head_dim = 0;
};
cudaError_t WriteKv(const KvWriteParams& p, cudaStream_t stream);

}  // namespace specula::kernels
