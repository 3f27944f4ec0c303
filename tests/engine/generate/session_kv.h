// Where a session's KV lives between turns, the parameter of the session tests (engine and
// gRPC): dense in the KV pool (no host store), dense offloaded to the host store, or sparse in
// the host store.
#pragma once

#include <string>

#include "gtest/gtest.h"

namespace specula::testing {

enum class SessionKv { kDensePool, kDenseOffloaded, kSparse };

inline std::string SessionKvName(const ::testing::TestParamInfo<SessionKv>& info) {
  switch (info.param) {
    case SessionKv::kDensePool:
      return "dense_pool";
    case SessionKv::kDenseOffloaded:
      return "dense_offloaded";
    case SessionKv::kSparse:
      return "sparse";
  }
  return "unknown";
}

inline auto AllSessionKvs() {
  return ::testing::Values(SessionKv::kDensePool, SessionKv::kDenseOffloaded, SessionKv::kSparse);
}

}  // namespace specula::testing
