// Test data in backend memory, where operations read their metadata from (DeviceSpans): Put
// copies a host vector there, Zeros makes an output, Get reads one back. The buffers live as long
// as this object.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "gtest/gtest.h"

namespace specula::testing {

class DeviceData {
 public:
  explicit DeviceData(Backend& backend) : backend_(backend) {}

  template <typename T>
  DeviceSpan<const T> Put(const std::vector<T>& values) {
    DeviceSpan<T> span = Zeros<T>(values.size());
    if (!values.empty()) backend_.CopyToDevice(span.data(), values.data(), span.bytes());
    return span;
  }
  template <typename T>
  DeviceSpan<T> Zeros(size_t n) {
    auto buffer = backend_.Allocate(std::max<size_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    auto* data = buffer->template as<T>();
    std::vector<char> zeros(std::max<size_t>(n, 1) * sizeof(T), 0);
    backend_.CopyToDevice(data, zeros.data(), zeros.size());
    buffers_.push_back(std::move(*buffer));
    return DeviceSpan<T>(data, n);
  }
  template <typename T>
  std::vector<T> Get(DeviceSpan<T> span) {
    std::vector<std::remove_const_t<T>> out(span.size());
    if (!out.empty()) backend_.CopyToHost(out.data(), span.data(), span.bytes());
    return out;
  }

 private:
  Backend& backend_;
  std::vector<DeviceBuffer> buffers_;
};

// Page lists for SparseDecodeAttention: list i is lists[i] (pages and valid tokens).
struct PageLists {
  std::vector<int32_t> begin, count, pages, tokens;
  int32_t max_pages = 0;
  void Add(const std::vector<int32_t>& list_pages, const std::vector<int32_t>& list_tokens) {
    begin.push_back(static_cast<int32_t>(pages.size()));
    count.push_back(static_cast<int32_t>(list_pages.size()));
    pages.insert(pages.end(), list_pages.begin(), list_pages.end());
    tokens.insert(tokens.end(), list_tokens.begin(), list_tokens.end());
    max_pages = std::max(max_pages, static_cast<int32_t>(list_pages.size()));
  }
  SparseAttentionBatch Batch(DeviceData& data, int32_t rows, int32_t heads, int32_t kv_heads,
                             float scale, int32_t first_row = 0) const {
    SparseAttentionBatch b;
    b.first_row = first_row;
    b.rows = rows;
    b.list_begin = data.Put(begin);
    b.list_count = data.Put(count);
    b.pages = data.Put(pages);
    b.page_tokens = data.Put(tokens);
    b.max_pages = max_pages;
    b.num_heads = heads;
    b.num_kv_heads = kv_heads;
    b.scale = scale;
    return b;
  }
};

// Dense paged attention metadata for sequences given as (q_begin, q_len, kv_len, block table).
struct DenseBatch {
  std::vector<int32_t> row_keys, row_begin, blocks, seq_rows = {0};
  int32_t rows = 0;
  int32_t max_keys = 0;
  int32_t max_seq_rows = 0;
  void Add(int32_t q_len, int32_t kv_len, const std::vector<int32_t>& table) {
    for (int32_t i = 0; i < q_len; ++i) {
      row_keys.push_back(kv_len - q_len + i + 1);
      row_begin.push_back(static_cast<int32_t>(blocks.size()));
    }
    blocks.insert(blocks.end(), table.begin(), table.end());
    rows += q_len;
    seq_rows.push_back(rows);
    max_keys = std::max(max_keys, kv_len);
    max_seq_rows = std::max(max_seq_rows, q_len);
  }
  AttentionBatch Batch(DeviceData& data, int32_t heads, float scale, int32_t first_row = 0) const {
    AttentionBatch b;
    b.first_row = first_row;
    b.rows = rows;
    b.row_keys = data.Put(row_keys);
    b.row_block_begin = data.Put(row_begin);
    b.blocks = data.Put(blocks);
    b.max_keys = max_keys;
    b.num_heads = heads;
    b.scale = scale;
    b.seq_rows = data.Put(seq_rows);
    b.seqs = static_cast<int32_t>(seq_rows.size()) - 1;
    b.max_seq_rows = max_seq_rows;
    return b;
  }
};

}  // namespace specula::testing
