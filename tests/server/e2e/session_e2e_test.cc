// End to end over gRPC, sessions (docs/SESSIONS.md): a multi-turn conversation reuses its KV
// (usage.cached_prompt_tokens) and answers exactly as a request without the session; sessions
// are listed, deleted back to the baseline, refused while busy; shared system prompts are reused
// across sessions; the prefix-cache metrics count what happened.
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/session_kv.h"
#include "tests/server/e2e/test_server.h"
#include "tests/server/prometheus_scrape.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kPage = 16;

// Sparse requests run with a working set far smaller than the prompts (sinks 1 page + recent
// 1 page + budget 2 pages), so reused pages are selected and prefetched like computed ones.
void SessionConfig(ServerConfig& c, SessionKv kind) {
  const bool sparse = kind == SessionKv::kSparse;
  c.server.metrics_listen = "127.0.0.1:0";
  c.kv_cache.page_size = kPage;
  c.kv_cache.prefix_cache = false;  // session-less requests are computed from scratch
  c.sparse.options.enabled = sparse;
  c.sparse.options.budget_tokens = 32;
  c.sparse.options.sink_tokens = 16;
  c.sparse.options.recent_tokens = 16;
  c.sparse.options.min_context_tokens = 0;
  c.kv_cache.host_capacity_tokens = kind == SessionKv::kDensePool ? 0 : 65536;
}

void SessionConfig(ServerConfig& c, bool sparse) {
  SessionConfig(c, sparse ? SessionKv::kSparse : SessionKv::kDensePool);
}

std::vector<int32_t> Text(int n, int seed) {
  std::vector<int32_t> v;
  for (int j = 0; j < n; ++j) v.push_back(1 + (seed * 41 + j * 13) % 400);
  return v;
}

v1::GenerateRequest InSession(const std::vector<int32_t>& prompt, int max_tokens,
                              const std::string& session) {
  v1::GenerateRequest r = GreedyIds(prompt, max_tokens);
  r.set_session_id(session);
  return r;
}

Exposition IdleMetrics(Server& server) {
  EXPECT_TRUE(server.engine().WaitIdle(absl::Now() + absl::Seconds(30)));
  Exposition m = ScrapeMetrics(server.metrics().metrics_port());
  EXPECT_THAT(m.errors, ::testing::IsEmpty());
  return m;
}

class SessionE2eTest : public ::testing::TestWithParam<SessionKv> {};

// Four turns of an agent: each prompt is the last prompt, the model's answer and a tool result.
// An offloaded dense session holds host memory between turns and no KV-cache block.
TEST_P(SessionE2eTest, TurnsReuseTheConversationsKvAndAnswerAsWithoutTheSession) {
  const SessionKv kind = GetParam();
  const bool sparse = kind == SessionKv::kSparse;
  const bool in_host = kind != SessionKv::kDensePool;
  auto server = StartServer([&](ServerConfig& c) { SessionConfig(c, kind); });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::ModelInfo info;
  grpc::ClientContext info_ctx;
  ASSERT_TRUE(stub->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());
  ASSERT_EQ(info.kv_cache_dtype(), "f32");
  // K and V of every layer and KV head.
  const uint64_t kv_bytes_per_token = uint64_t{2} * info.num_layers() *
                                      info.num_key_value_heads() * info.head_dim() * sizeof(float);
  std::vector<int32_t> prompt = Text(45, 1);
  int64_t reused = 0, prev_kept = 0;
  for (int turn = 0; turn < 4; ++turn) {
    const StreamResult got = RunGenerate(*stub, InSession(prompt, 12, "agent-7"));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const StreamResult alone = RunGenerate(*stub, GreedyIds(prompt, 12));
    ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
    EXPECT_EQ(got.tokens, alone.tokens) << "turn " << turn;
    EXPECT_EQ(alone.usage.cached_prompt_tokens(), 0u);
    EXPECT_EQ(got.usage.prompt_tokens(), prompt.size());
    ASSERT_EQ(got.kv_stats.has_value(), true);
    EXPECT_EQ(got.kv_stats->sparse(), sparse);
    // Turn N+1 reuses what turn N kept (below), all of it.
    EXPECT_EQ(got.usage.cached_prompt_tokens(), static_cast<uint64_t>(prev_kept)) << turn;
    reused += got.usage.cached_prompt_tokens();
    // Everything but the last answer token has KV. Dense keeps all of it (the partly filled
    // last page is copied on reuse), sparse its whole pages.
    const int64_t written = static_cast<int64_t>(prompt.size() + got.tokens.size()) - 1;
    const int64_t kept = sparse ? written / kPage * kPage : written;
    const int64_t kept_pages = (kept + kPage - 1) / kPage;
    prev_kept = kept;
    prompt.insert(prompt.end(), got.tokens.begin(), got.tokens.end());
    const std::vector<int32_t> tool_result = Text(9 + 7 * turn, 10 + turn);
    prompt.insert(prompt.end(), tool_result.begin(), tool_result.end());

    v1::ListSessionsResponse list;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
    ASSERT_EQ(list.sessions_size(), 1);
    const v1::Session& s = list.sessions(0);
    EXPECT_EQ(s.session_id(), "agent-7");
    EXPECT_EQ(s.cached_tokens(), static_cast<uint64_t>(kept));
    EXPECT_EQ(in_host ? s.host_bytes() : s.kv_cache_bytes(),
              kept_pages * kPage * kv_bytes_per_token);
    EXPECT_EQ(in_host ? s.kv_cache_bytes() : s.host_bytes(), 0u);
    EXPECT_FALSE(s.running());
    EXPECT_GT(s.last_use_unix_ms(), absl::ToUnixMillis(absl::Now() - absl::Minutes(1)));
  }
  EXPECT_GT(reused, 0);
  Exposition m = IdleMetrics(*server);
  EXPECT_EQ(m.Get("specula_prefix_cache_hit_tokens_total"), static_cast<double>(reused));
  EXPECT_EQ(m.Get("specula_sessions"), 1);
  EXPECT_GT(m.Get("specula_session_kv_bytes"), 0);
  if (in_host) {
    EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
    EXPECT_GT(m.Get("specula_kv_host_pages_used"), 0);
  }

  v1::DeleteSessionRequest del;
  del.set_session_id("agent-7");
  v1::DeleteSessionResponse ignored;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->DeleteSession(&ctx, del, &ignored).ok());
  m = ScrapeMetrics(server->metrics().metrics_port());
  EXPECT_EQ(m.Get("specula_sessions"), 0);
  EXPECT_EQ(m.Get("specula_session_kv_bytes"), 0);
  EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
  EXPECT_EQ(m.Get("specula_kv_host_pages_used"), 0);
  EXPECT_GT(m.Get(R"(specula_kv_cache_evictions_total{reason="session_deleted"})"), 0);
  grpc::ClientContext again;
  EXPECT_EQ(stub->DeleteSession(&again, del, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
}

// One request per session at a time: a second turn and a delete while the first streams are
// FAILED_PRECONDITION, and the first is unaffected; once it ends, both work.
TEST(SessionE2eTest, ABusySessionRefusesASecondTurnAndDeletion) {
  auto server = StartServer([](ServerConfig& c) { SessionConfig(c, false); });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  // Paused, the engine queues the first turn and runs nothing: it stays queued (its session
  // busy, its stream open) until its client cancels it.
  server->engine().SetPausedForTesting(true);
  // The context outlives the reading thread: a TryCancel must not race its destruction.
  grpc::ClientContext first_ctx;
  grpc::Status first_status;
  std::thread t([&] {
    auto reader = stub->Generate(&first_ctx, InSession(Text(40, 3), 3000, "busy"));
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    first_status = reader->Finish();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (server->engine().load().waiting < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));  // polls the queue, not a stand-in for an event
  }
  ASSERT_EQ(server->engine().load().waiting, 1);
  const StreamResult second = RunGenerate(*stub, InSession(Text(40, 3), 4, "busy"));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(second.status.error_message(), HasSubstr("'busy'"));
  v1::DeleteSessionRequest del;
  del.set_session_id("busy");
  v1::DeleteSessionResponse ignored;
  grpc::ClientContext del_ctx;
  EXPECT_EQ(stub->DeleteSession(&del_ctx, del, &ignored).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  first_ctx.TryCancel();
  t.join();
  server->engine().SetPausedForTesting(false);
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::CANCELLED);
  // The client hears CANCELLED at once; the session is free once the engine has retired the
  // request (docs/SESSIONS.md: retry FAILED_PRECONDITION after a cancel).
  ASSERT_TRUE(server->engine().WaitIdle(absl::Now() + absl::Seconds(30)));
  const StreamResult next = RunGenerate(*stub, InSession(Text(40, 3), 4, "busy"));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  grpc::ClientContext del_again;
  EXPECT_TRUE(stub->DeleteSession(&del_again, del, &ignored).ok());
}

TEST(SessionE2eTest, MalformedSessionIdsAreInvalidArgument) {
  auto server = StartServer([](ServerConfig& c) { SessionConfig(c, false); });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  for (const std::string& id : {std::string(129, 'a'), std::string("has space"),
                                std::string("tab\t"), std::string("caf\xc3\xa9")}) {
    const StreamResult r = RunGenerate(*stub, InSession(Text(20, 1), 2, id));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(r.status.error_message(), HasSubstr("session_id")) << id;
    v1::DeleteSessionRequest del;
    del.set_session_id(id);
    v1::DeleteSessionResponse ignored;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->DeleteSession(&ctx, del, &ignored).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  v1::DeleteSessionRequest empty;
  v1::DeleteSessionResponse ignored;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->DeleteSession(&ctx, empty, &ignored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// Behind a session-affine proxy the session id travels as x-session-id metadata (a proxy cannot
// hash on the body): it names the session as session_id does; the two disagreeing is refused.
TEST(SessionE2eTest, TheSessionIdMayComeAsMetadata) {
  auto server = StartServer([](ServerConfig& c) { SessionConfig(c, false); });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  auto with_header = [](const std::string& id) {
    return [id](grpc::ClientContext& ctx) { ctx.AddMetadata("x-session-id", id); };
  };
  std::vector<int32_t> prompt = Text(3 * kPage, 2);
  const StreamResult first = RunGenerate(*stub, GreedyIds(prompt, 4), with_header("agent-7"));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  prompt.insert(prompt.end(), first.tokens.begin(), first.tokens.end());
  const std::vector<int32_t> more = Text(kPage, 3);
  prompt.insert(prompt.end(), more.begin(), more.end());
  // The second turn names the session in the body only: the same session, its KV reused.
  const StreamResult second = RunGenerate(*stub, InSession(prompt, 2, "agent-7"));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_GE(second.usage.cached_prompt_tokens(), static_cast<uint32_t>(3 * kPage));
  const StreamResult clash =
      RunGenerate(*stub, InSession(prompt, 2, "agent-7"), with_header("agent-8"));
  EXPECT_EQ(clash.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(clash.status.error_message(), HasSubstr("x-session-id"));
  const StreamResult bad = RunGenerate(*stub, GreedyIds(prompt, 2), with_header("has space"));
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Agents of one framework share a system prompt and tool schemas: the second session's first
// turn reuses the first session's pages of it, and the metrics count those tokens.
TEST(SessionE2eTest, ASecondSessionReusesASharedSystemPrompt) {
  auto server = StartServer([](ServerConfig& c) { SessionConfig(c, true); });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  std::vector<int32_t> system = Text(70, 5);
  std::vector<int32_t> a = system, b = system;
  for (int32_t t : Text(10, 6)) a.push_back(t);
  for (int32_t t : Text(12, 7)) b.push_back(t);
  ASSERT_TRUE(RunGenerate(*stub, InSession(a, 3, "agent-a")).status.ok());
  const StreamResult rb = RunGenerate(*stub, InSession(b, 3, "agent-b"));
  ASSERT_TRUE(rb.status.ok()) << rb.status.error_message();
  EXPECT_EQ(rb.usage.cached_prompt_tokens(), 64u);  // 70 system tokens: 4 whole pages
  const Exposition m = IdleMetrics(*server);
  EXPECT_EQ(m.Get("specula_prefix_cache_hit_tokens_total"), 64);
  EXPECT_EQ(m.Get("specula_sessions"), 2);
}

std::vector<std::string> SessionIds(v1::Specula::Stub& stub) {
  v1::ListSessionsResponse list;
  grpc::ClientContext ctx;
  EXPECT_TRUE(stub.ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  std::vector<std::string> ids;
  for (const v1::Session& s : list.sessions()) ids.push_back(s.session_id());
  std::sort(ids.begin(), ids.end());
  return ids;
}

// ListSessions pages over gRPC: following next_page_token yields every session once, in id
// order; kv_cache.max_sessions drops the least recently used one and counts it.
TEST(SessionE2eTest, SessionsComeInPagesAndAreBoundedInNumber) {
  auto server = StartServer([](ServerConfig& c) {
    SessionConfig(c, false);
    c.kv_cache.max_sessions = 5;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  int seed = 0;
  for (const char* id : {"s0", "s1", "s2", "s3", "s4", "s5"}) {  // s0, the oldest, is dropped
    ASSERT_TRUE(RunGenerate(*stub, InSession(Text(20, ++seed), 2, id)).status.ok());
  }
  std::vector<std::string> seen;
  v1::ListSessionsRequest request;
  request.set_page_size(2);
  int pages = 0;
  do {
    v1::ListSessionsResponse page;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->ListSessions(&ctx, request, &page).ok());
    EXPECT_LE(page.sessions_size(), 2);
    for (const v1::Session& s : page.sessions()) seen.push_back(s.session_id());
    request.set_page_token(page.next_page_token());
    ASSERT_LT(++pages, 10);
  } while (!request.page_token().empty());
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(seen, ::testing::ElementsAre("s1", "s2", "s3", "s4", "s5"));
  v1::ListSessionsResponse ignored;
  grpc::ClientContext bad_ctx;
  request.set_page_token("not a token");
  const grpc::Status bad = stub->ListSessions(&bad_ctx, request, &ignored);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("page_token"));
  const Exposition m = IdleMetrics(*server);
  EXPECT_EQ(m.Get("specula_sessions"), 5);
  EXPECT_GT(m.Get(R"(specula_kv_cache_evictions_total{reason="session_limit"})"), 0);
}

// kv_cache.session_ttl_seconds over gRPC: an idle session disappears from ListSessions on its
// own (the engine wakes for the expiry), counted as a session_ttl eviction, its KV freed.
TEST(SessionE2eTest, IdleSessionsExpireAfterTheirTtl) {
  auto server = StartServer([](ServerConfig& c) {
    SessionConfig(c, false);
    c.kv_cache.session_ttl_seconds = 0.3;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  ASSERT_TRUE(RunGenerate(*stub, InSession(Text(50, 1), 4, "short-lived")).status.ok());
  EXPECT_EQ(SessionIds(*stub), std::vector<std::string>{"short-lived"});
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!SessionIds(*stub).empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));  // polls for the expiry the engine schedules
  }
  EXPECT_TRUE(SessionIds(*stub).empty()) << "the idle session never expired";
  Exposition m = IdleMetrics(*server);
  EXPECT_GT(m.Get(R"(specula_kv_cache_evictions_total{reason="session_ttl"})"), 0);
  EXPECT_EQ(m.Get("specula_sessions"), 0);
  EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
}

// When a request needs the room, idle sessions are dropped least recently used first: with a
// 16-block cache holding two sessions of 6 blocks, a 9-block request drops the older one only.
TEST(SessionE2eTest, TheLeastRecentlyUsedIdleSessionMakesRoom) {
  auto server = StartServer([](ServerConfig& c) {
    SessionConfig(c, false);
    c.kv_cache.capacity_tokens = 16 * kPage;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  ASSERT_TRUE(RunGenerate(*stub, InSession(Text(96, 1), 4, "older")).status.ok());
  ASSERT_TRUE(RunGenerate(*stub, InSession(Text(96, 2), 4, "newer")).status.ok());
  EXPECT_EQ(SessionIds(*stub), (std::vector<std::string>{"newer", "older"}));
  const StreamResult big = RunGenerate(*stub, GreedyIds(Text(130, 3), 8));
  ASSERT_TRUE(big.status.ok()) << big.status.error_message();
  EXPECT_EQ(big.tokens, Offline(Text(130, 3), 8).tokens);
  EXPECT_EQ(SessionIds(*stub), std::vector<std::string>{"newer"});
  Exposition m = IdleMetrics(*server);
  EXPECT_GT(m.Get(R"(specula_kv_cache_evictions_total{reason="session_dropped"})"), 0);
  EXPECT_EQ(m.Get("specula_sessions"), 1);
}

// Six 40-token prompts (seeds seed..seed+5) queued before any starts, so they run at once;
// every stream must equal its offline solo run.
void ExpectSixAtOnceAnswerExactly(Server& server, int seed, int max_tokens) {
  server.engine().SetPausedForTesting(true);
  std::vector<StreamResult> results(6);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server.address());
      results[i] = RunGenerate(*stub, GreedyIds(Text(40, seed + i), max_tokens));
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (server.engine().load().waiting < 6 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));  // polls the queue, not a stand-in for an event
  }
  EXPECT_EQ(server.engine().load().waiting, 6);
  server.engine().SetPausedForTesting(false);
  for (auto& t : clients) t.join();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, Offline(Text(40, seed + i), max_tokens).tokens) << i;
  }
}

// Preemption over gRPC: a KV cache of 10 blocks serves six concurrent 70-token requests (5
// blocks each at the end); the youngest are preempted and resumed, and every stream equals its
// solo run. Afterwards no block is held.
TEST(SessionE2eTest, AFullCachePreemptsAndEveryStreamStillAnswersExactly) {
  auto server = StartServer([](ServerConfig& c) {
    SessionConfig(c, false);
    c.kv_cache.capacity_tokens = 10 * kPage;
  });
  ASSERT_NE(server, nullptr);
  ExpectSixAtOnceAnswerExactly(*server, /*seed=*/20, /*max_tokens=*/30);
  Exposition m = IdleMetrics(*server);
  EXPECT_GT(m.Get("specula_preemptions_total"), 0) << "the cache never ran out";
  EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
}

// The same for sparse requests, whose host pages come as they decode: a host store for two
// whole requests (2 x 34 pages per head) admits three and serves six at full budget; the
// youngest decoding ones are preempted and resumed, and every stream equals the dense engine's.
TEST(SessionE2eTest, AFullHostStorePreemptsSparseRequestsAndEveryStreamAnswersExactly) {
  auto server = StartServer([](ServerConfig& c) {
    SessionConfig(c, true);
    c.sparse.options.budget_tokens = 1024;  // full budget: sparse equals dense
    c.kv_cache.host_capacity_tokens = 2 * 34 * kPage;
  });
  ASSERT_NE(server, nullptr);
  ExpectSixAtOnceAnswerExactly(*server, /*seed=*/30, /*max_tokens=*/500);
  Exposition m = IdleMetrics(*server);
  EXPECT_GT(m.Get("specula_preemptions_total"), 0) << "the host store never ran out";
  EXPECT_EQ(m.Get("specula_kv_host_pages_used"), 0);
  EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
}

INSTANTIATE_TEST_SUITE_P(WhereSessionsLive, SessionE2eTest, AllSessionKvs(), SessionKvName);

}  // namespace
}  // namespace specula::testing
