// One sparse sequence's device state and pages, built by hand on any backend, for operation-level
// tests of engine/backend/sparse_ops.h (the CPU reference here, the CUDA kernels against it in
// tests/cuda/). Keys are chosen by the test; a page's keys are page-specific so a wrong page
// read shows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/working_set.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu/device_data.h"

namespace specula::testing {

struct WorldShape {
  int32_t layers = 1;
  int32_t kv_heads = 2;
  int32_t heads = 4;
  int32_t head_dim = 16;
  int32_t page_size = 4;
  int32_t sink_pages = 1;
  int32_t window_pages = 1;
  int32_t budget_pages = 3;
  int32_t cache_slots = 5;
  int32_t tokens = 4 * 20;  // host capacity of the sequence: pages_per_head = tokens / page_size
  DType dtype = DType::kF32;
};

class SparseWorld {
 public:
  SparseWorld(Backend& backend, const WorldShape& s) : backend_(backend), s_(s), data_(backend) {
    KvPoolOptions p{s.layers, s.kv_heads, s.head_dim, s.page_size,
                    s.sink_pages + s.window_pages + 1 + s.cache_slots + 8};
    p.dtype = s.dtype;
    pool_ = KvPool::Create(backend, p).value();
    // Zeroed, so two backends' pools compare byte for byte.
    backend.Memset(pool_.Layer(0).base, 0, pool_.bytes_per_block() * p.num_blocks);
    HostKvStoreOptions h;
    h.num_layers = s.layers;
    h.num_kv_heads = s.kv_heads;
    h.head_dim = s.head_dim;
    h.page_size = s.page_size;
    h.capacity_tokens = s.tokens * 2;
    h.dtype = s.dtype;
    store_ =
        HostKvStore::Create(h, [&](size_t b) { return backend.AllocatePinnedHost(b); }).value();
    WorkingSetGeometry g;
    g.layers = s.layers;
    g.kv_heads = s.kv_heads;
    g.page_size = s.page_size;
    g.sink_pages = s.sink_pages;
    g.window_pages = s.window_pages;
    g.budget_pages = s.budget_pages;
    g.cache_slots = s.cache_slots;
    HostKvSequence seq = store_->Reserve(s.tokens).value();
    auto state = backend.Allocate(WorkingSet::DeviceStateBytes(g, seq.pages_per_head())).value();
    auto blocks = pool_.Allocate(g.slots_per_head()).value();
    ws_ = std::make_unique<WorkingSet>(g, std::move(seq), blocks, s.tokens, std::move(state));
    std::vector<char> init(ws_->device_state_bytes());
    ws_->StageDeviceState(init.data());
    backend.CopyToDevice(ws_->device_state(), init.data(), init.size());
  }
  ~SparseWorld() { store_->Release(ws_->mutable_host()); }

  Backend& backend() { return backend_; }
  DeviceData& data() { return data_; }
  WorkingSet& ws() { return *ws_; }
  const WorkingSet& ws() const { return *ws_; }
  HostKvStore& store() { return *store_; }
  KvPool& pool() { return pool_; }
  const WorldShape& shape() const { return s_; }
  PagePoolView device_pool(int32_t layer = 0) const { return PagesOf(pool_.Layer(layer)); }
  PagePoolView host_pool() const { return store_->pool(); }
  int32_t host_page(int32_t layer, int32_t head, int32_t page) const {
    return ws_->host().page(layer, head, page);
  }
  // The device pool page of slot `slot` of `head` (sink, ring or cache slot index).
  int32_t pool_page(int32_t slot, int32_t head) const {
    return ws_->device_blocks()[slot] * s_.kv_heads + head;
  }

  // Writes token `pos` of every (layer, head) into the host store: key channel c of page p is
  // key_of(layer, head, pos, c), value channel c is 1000 + pos.
  template <typename KeyFn>
  void FillHost(int32_t tokens, KeyFn key_of) {
    std::vector<float> k(s_.head_dim), v(s_.head_dim);
    for (int32_t l = 0; l < s_.layers; ++l) {
      for (int32_t h = 0; h < s_.kv_heads; ++h) {
        for (int32_t pos = 0; pos < tokens; ++pos) {
          for (int32_t c = 0; c < s_.head_dim; ++c) {
            k[c] = key_of(l, h, pos, c);
            v[c] = 1000.0f + static_cast<float>(pos);
          }
          store_->WriteToken(ws_->host(), l, h, pos, k.data(), v.data());
        }
      }
    }
  }

  // The device state arrays of (layer, head), read back.
  struct HeadState {
    std::vector<int32_t> page_slot, slot_page, slot_state;
    std::vector<uint32_t> slot_stamp;
  };
  HeadState Read(int32_t layer, int32_t head) {
    const SparseSeqDevice& d = ws_->device();
    const int64_t lh = static_cast<int64_t>(layer) * s_.kv_heads + head;
    HeadState out;
    out.page_slot = data_.Get(DeviceSpan<int32_t>(d.page_slot + lh * d.pages, d.pages));
    out.slot_page = data_.Get(DeviceSpan<int32_t>(d.slot_page + lh * d.cache_slots, d.cache_slots));
    out.slot_state =
        data_.Get(DeviceSpan<int32_t>(d.slot_state + lh * d.cache_slots, d.cache_slots));
    out.slot_stamp =
        data_.Get(DeviceSpan<uint32_t>(d.slot_stamp + lh * d.cache_slots, d.cache_slots));
    return out;
  }

  // Maps `page` of (layer, head) to cache slot j, in `state` with `stamp`.
  void SetSlot(int32_t layer, int32_t head, int32_t j, int32_t page, int32_t state,
               uint32_t stamp) {
    const SparseSeqDevice& d = ws_->device();
    const int64_t lh = static_cast<int64_t>(layer) * s_.kv_heads + head;
    backend_.CopyToDevice(d.page_slot + lh * d.pages + page, &j, sizeof(j));
    backend_.CopyToDevice(d.slot_page + lh * d.cache_slots + j, &page, sizeof(page));
    backend_.CopyToDevice(d.slot_state + lh * d.cache_slots + j, &state, sizeof(state));
    backend_.CopyToDevice(d.slot_stamp + lh * d.cache_slots + j, &stamp, sizeof(stamp));
  }

  // A decode row at `pos`, step `step`.
  SparseRowPlan Row(int32_t pos, uint32_t step, int32_t q_row = 0) const {
    SparseRowPlan r;
    r.seq = ws_->device();
    r.q_row = q_row;
    r.pos = pos;
    r.step = step;
    const WorkingSetGeometry& g = ws_->geometry();
    r.candidates = g.window_begin(pos / s_.page_size) - g.sink_pages;
    r.list_capacity = g.list_capacity();
    r.completes_page = pos % s_.page_size == s_.page_size - 1;
    return r;
  }

 private:
  Backend& backend_;
  WorldShape s_;
  DeviceData data_;
  KvPool pool_;
  std::unique_ptr<HostKvStore> store_;
  std::unique_ptr<WorkingSet> ws_;
};

}  // namespace specula::testing
