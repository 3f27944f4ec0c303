// The CUDA backend's sparse KV operations: engine/backend/sparse_ops.h's arguments handed to the
// kernels of kernels/sparse.h. The plan's rows and copy entries are kernels/sparse_abi.h's structs
// on both sides, read by the kernels as the host wrote them.

#include "engine/cuda/cuda_backend_impl.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_stream.h"
#include "kernels/sparse.h"

namespace specula::cuda_internal {
namespace {

kernels::Pool PoolOf(const PagePoolView& v) {
  return kernels::Pool{v.base, static_cast<int64_t>(v.page_bytes())};
}
kernels::PageGeometry GeometryOf(const PagePoolView& v) {
  return kernels::PageGeometry{v.page_size, v.head_dim, v.dtype};
}

}  // namespace

void CudaBackend::ScorePages(const Mat& q, const SparseScoreArgs& a) {
  kernels::ScoreParams p;
  p.rows = a.rows.data();
  p.num_rows = static_cast<int32_t>(a.rows.size());
  p.layer = a.layer;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.max_candidates = a.max_candidates;
  p.q_first_row = a.q_first_row;
  p.exact = a.scoring == PageScoring::kExact;
  p.q = q.data;
  p.q_stride = q.stride;
  p.summaries = a.summaries;
  p.host = PoolOf(a.host_pool);
  p.geometry = GeometryOf(a.host_pool);
  p.scores = a.scores.data();
  CheckLaunch(kernels::ScorePages(p, stream()), "ScorePages");
}

void CudaBackend::SelectPages(const SparseSelectArgs& a) {
  kernels::SelectParams p;
  p.rows = a.rows.data();
  p.num_rows = static_cast<int32_t>(a.rows.size());
  p.layer = a.layer;
  p.num_kv_heads = a.num_kv_heads;
  p.mode = a.mode;
  p.stage_ranked = a.stage_ranked;
  p.defer_missing = a.defer_missing;
  p.urgent = a.urgent;
  p.max_cache_slots = a.max_cache_slots;
  p.scores = a.scores.data();
  p.device = PoolOf(a.device_pool);
  p.host = PoolOf(a.host_pool);
  p.geometry = GeometryOf(a.device_pool);
  p.geometry.page_size = a.page_size;
  p.list_pages = a.list_pages.data();
  p.list_tokens = a.list_tokens.data();
  p.list_count = a.list_count.data();
  p.copies = a.staging.copies.data();
  p.copy_count = a.staging.copy_count.data();
  p.copy_stride = a.staging.copy_stride;
  p.counters = a.counters.data();
  CheckLaunch(kernels::SelectPages(p, stream()), "SelectPages");
}

void CudaBackend::RetireWindowPages(const SparseRetireArgs& a) {
  kernels::RetireParams p;
  p.rows = a.rows.data();
  p.num_rows = static_cast<int32_t>(a.rows.size());
  p.layer = a.layer;
  p.num_kv_heads = a.num_kv_heads;
  p.max_cache_slots = a.max_cache_slots;
  p.device = PoolOf(a.device_pool);
  CheckLaunch(kernels::RetireWindowPages(p, stream()), "RetireWindowPages");
}

void CudaBackend::CompletePages(const SparseCompleteArgs& a) {
  kernels::CompleteParams p;
  p.rows = a.rows.data();
  p.num_rows = static_cast<int32_t>(a.rows.size());
  p.layer = a.layer;
  p.num_kv_heads = a.num_kv_heads;
  p.device = PoolOf(a.device_pool);
  p.host = PoolOf(a.host_pool);
  p.geometry = GeometryOf(a.host_pool);
  p.summaries = a.summaries;
  CheckLaunch(kernels::CompletePages(p, stream()), "CompletePages");
}

void CudaBackend::SummarizePages(const PageSummaryArgs& a) {
  CHECK_EQ(a.src.size(), a.dst.size());
  kernels::SummaryParams p;
  p.src = a.src.data();
  p.dst = a.dst.data();
  p.count = static_cast<int32_t>(a.src.size());
  p.pool = PoolOf(a.pool);
  p.geometry = GeometryOf(a.pool);
  p.summaries = a.summaries;
  CheckLaunch(kernels::SummarizePages(p, stream()), "SummarizePages");
}

void CudaBackend::GatherPages(Stream& stream, const PageGatherArgs& a) {
  auto* copy = dynamic_cast<CudaStream*>(&stream);
  CHECK(copy != nullptr) << "GatherPages runs on a stream from CreateStream()";
  kernels::GatherParams p;
  p.copies = a.copies.data();
  p.copy_count = a.copy_count.data();
  p.lists = a.lists;
  p.copy_stride = a.copy_stride;
  p.page_bytes = static_cast<int64_t>(a.page_bytes);
  p.pages_gathered = a.pages_gathered;
  CheckLaunch(kernels::GatherPages(p, copy->raw()), "GatherPages");
}

}  // namespace specula::cuda_internal
