// KV reuse across requests in the Generator (docs/SESSIONS.md): a session's next turn prefills
// only what its last turn did not cache, and generates exactly what a fresh server would; shared
// prefixes are found across sessions; sessions are deleted, expired and dropped for room, and
// pages return to the baseline every time.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/common/fault_injection.h"
#include "engine/generate/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"
#include "tests/engine/generate/session_kv.h"

namespace specula {
namespace {

using ::specula::testing::AllTestModels;
using ::specula::testing::Greedy;
using ::specula::testing::AllSessionKvs;
using ::specula::testing::SessionKv;
using ::specula::testing::SessionKvName;
using ::specula::testing::TestModelDir;

constexpr int kPage = 16;

// A host store of `host_tokens` (-1: 8192 with sparse, none without; dense sessions then stay in
// the KV pool).
GeneratorOptions Options(bool sparse, bool sessionless = false, int64_t kv_tokens = 8192,
                         int64_t host_tokens = -1) {
  GeneratorOptions o;
  o.prefill_chunk_tokens = 48;
  o.kv_cache_tokens = kv_tokens;
  o.sparse.enabled = sparse;
  o.sparse.min_context_tokens = 0;  // every request sparse when enabled
  o.sparse.budget_tokens = 32;
  o.sparse.sink_tokens = 16;
  o.sparse.recent_tokens = 32;
  o.host_capacity_tokens = host_tokens >= 0 ? host_tokens : (sparse ? 8192 : 0);
  o.prefix_cache.cache_sessionless = sessionless;
  return o;
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> v;
  for (int j = 0; j < n; ++j) v.push_back(1 + (seed * 31 + j * 17) % 250);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Turn {
  std::vector<int32_t> tokens;
  int64_t cached = 0;
};

// Runs one request alone to completion and reports how much of its prompt came from the cache.
Turn RunAlone(Generator& gen, GenerationRequest request) {
  auto id = gen.Add(std::move(request));
  EXPECT_TRUE(id.ok()) << id.status();
  Turn turn;
  if (!id.ok()) return turn;
  turn.cached = gen.CachedPromptTokens(*id);
  std::vector<SequenceOutput> outputs;
  bool done = false;
  while (!done) {
    outputs.clear();
    EXPECT_TRUE(gen.Step(&outputs).ok());
    for (const SequenceOutput& o : outputs) {
      turn.tokens.insert(turn.tokens.end(), o.tokens.begin(), o.tokens.end());
      done |= o.finish != FinishReason::kNone;
    }
  }
  return turn;
}

GenerationRequest InSession(std::vector<int32_t> prompt, int max_tokens, std::string session) {
  GenerationRequest r = Greedy(std::move(prompt), max_tokens);
  r.session_id = std::move(session);
  return r;
}

int64_t PageFloor(int64_t n) { return n / kPage * kPage; }

GeneratorOptions Options(SessionKv kind) {
  return Options(kind == SessionKv::kSparse, false, 8192,
                 kind == SessionKv::kDensePool ? 0 : 8192);
}

class SessionTest : public ::testing::TestWithParam<SessionKv> {};

// Three turns of a conversation; each turn's prompt is the last prompt + its output + new text.
// Turn N+1 reuses turn N's KV (prompt + output, less the last sampled token, whose KV is computed
// only when it is fed back): dense, all of it, the partly filled last page by copy-on-write
// (from the pool, or copied back from the host store); sparse, every full page. It generates
// what a server without the session generates for the same prompt. An offloaded dense session
// holds no KV-pool block between turns.
TEST_P(SessionTest, NextTurnReusesTheLastTurnAndGeneratesTheSame) {
  const SessionKv kind = GetParam();
  const bool sparse = kind == SessionKv::kSparse;
  const std::string model = TestModelDir(AllTestModels().front());
  auto gen = Generator::Create(model, Options(kind)).value();
  std::vector<int32_t> prompt = Tokens(37, 1);
  for (int turn = 0; turn < 3; ++turn) {
    const Turn got = RunAlone(*gen, InSession(prompt, 20, "agent-1"));
    auto fresh = Generator::Create(model, Options(kind)).value();
    const Turn want = RunAlone(*fresh, Greedy(prompt, 20));
    EXPECT_EQ(got.tokens, want.tokens) << "turn " << turn;
    EXPECT_EQ(want.cached, 0);
    if (turn > 0) {
      EXPECT_GT(got.cached, 0);
    }
    const std::vector<int32_t> next =
        Concat(Concat(prompt, got.tokens), Tokens(11 + turn * 9, turn + 2));
    const int64_t kv_written = static_cast<int64_t>(prompt.size() + got.tokens.size()) - 1;
    const int64_t reused = sparse ? PageFloor(kv_written) : kv_written;
    const std::vector<SessionInfo> sessions = gen->ListSessions().sessions;
    ASSERT_EQ(sessions.size(), 1u);
    EXPECT_EQ(sessions[0].id, "agent-1");
    EXPECT_EQ(sessions[0].tokens, reused);
    EXPECT_EQ(sessions[0].in_host, kind != SessionKv::kDensePool);
    EXPECT_GT(sessions[0].bytes, 0);
    EXPECT_FALSE(sessions[0].running);
    if (kind == SessionKv::kDenseOffloaded) {
      EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
      EXPECT_EQ(gen->host_pages_used(), sessions[0].bytes / static_cast<int64_t>(gen->host_store()->page_bytes()));
    }
    prompt = next;
    // The next turn will reuse exactly those tokens.
    if (turn < 2) {
      auto id = gen->Add(InSession(prompt, 20, "agent-1")).value();
      EXPECT_EQ(gen->CachedPromptTokens(id), reused);
      SequenceOutput ignored;
      ASSERT_TRUE(gen->Cancel(id, &ignored, /*kv_valid=*/false).ok());
    }
  }
  ASSERT_TRUE(gen->DeleteSession("agent-1").ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
  EXPECT_EQ(gen->host_pages_cached(), 0);
}

// A second session whose prompt starts with the same system prompt reuses its pages.
TEST_P(SessionTest, ASharedSystemPromptIsReusedAcrossSessions) {
  const bool sparse = GetParam() == SessionKv::kSparse;
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), Options(GetParam())).value();
  const std::vector<int32_t> system = Tokens(50, 7);
  RunAlone(*gen, InSession(Concat(system, Tokens(9, 8)), 4, "a"));
  const Turn b = RunAlone(*gen, InSession(Concat(system, Tokens(13, 9)), 4, "b"));
  // Dense: all 50, the last two copied out of a's block that goes on past them.
  EXPECT_EQ(b.cached, sparse ? PageFloor(50) : 50);
  // A request without a session neither reuses nor caches (kv_cache.prefix_cache off).
  EXPECT_EQ(RunAlone(*gen, Greedy(Concat(system, Tokens(5, 3)), 4)).cached, 0);
  EXPECT_EQ(gen->ListSessions().sessions.size(), 2u);
  ASSERT_TRUE(gen->DeleteSession("a").ok());
  ASSERT_TRUE(gen->DeleteSession("b").ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(WhereSessionsLive, SessionTest, AllSessionKvs(), SessionKvName);

GenerationRequest InSessionAs(SparseMode mode, std::vector<int32_t> prompt, int max_tokens,
                              std::string session) {
  GenerationRequest r = InSession(std::move(prompt), max_tokens, std::move(session));
  r.sparse.mode = mode;
  return r;
}

// A conversation that switches between dense and sparse turns keeps its KV in the host store
// either way, so each turn reuses the last one's whole pages: a sparse turn scores an offloaded
// dense turn's pages by the summaries computed at offload (a budget of 2 pages out of ~8
// candidates, so a wrong summary changes the selection), and a dense turn copies a sparse
// turn's pages into its blocks. Each turn generates what a fresh server does for its prompt.
TEST(SessionTest, ATurnOfTheOtherKindReusesTheConversationsKv) {
  const std::string model = TestModelDir(AllTestModels().front());
  GeneratorOptions o = Options(true);
  o.sparse.min_context_tokens = 1 << 20;  // each request names its kind
  auto gen = Generator::Create(model, o).value();
  std::vector<int32_t> prompt = Tokens(130, 4);
  const SparseMode kinds[] = {SparseMode::kDense, SparseMode::kSparse, SparseMode::kDense,
                              SparseMode::kSparse};
  for (int turn = 0; turn < 4; ++turn) {
    const Turn got = RunAlone(*gen, InSessionAs(kinds[turn], prompt, 12, "agent"));
    auto fresh = Generator::Create(model, o).value();
    const Turn want = RunAlone(*fresh, InSessionAs(kinds[turn], prompt, 12, "other"));
    EXPECT_EQ(got.tokens, want.tokens) << "turn " << turn;
    if (turn > 0) {
      EXPECT_GE(got.cached, PageFloor(static_cast<int64_t>(prompt.size()) - 30));
    }
    const std::vector<SessionInfo> sessions = gen->ListSessions().sessions;
    ASSERT_EQ(sessions.size(), 1u);
    EXPECT_TRUE(sessions[0].in_host);
    EXPECT_EQ(gen->kv_pool().used_blocks(), 0) << "turn " << turn;
    prompt = Concat(Concat(prompt, got.tokens), Tokens(17, turn + 20));
  }
  ASSERT_TRUE(gen->DeleteSession("agent").ok());
  EXPECT_EQ(gen->host_pages_used(), 0);
  EXPECT_EQ(gen->host_pages_cached(), 0);
}

// Offloading makes room in the host store like any other request: the least recently used idle
// session there is dropped. A turn whose KV the store cannot hold even so stays in the KV pool,
// and drops no session trying.
TEST(SessionTest, OffloadDropsTheLeastRecentlyUsedHostSessionOrStaysInThePool) {
  // 12 pages per layer and KV head: two sessions of 5 (80 tokens, no tail) fit, not three.
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()),
                               Options(false, false, 8192, 12 * kPage))
                 .value();
  RunAlone(*gen, InSession(Tokens(79, 1), 2, "old"));  // 80 tokens of KV
  RunAlone(*gen, InSession(Tokens(79, 2), 2, "mid"));
  RunAlone(*gen, InSession(Tokens(79, 3), 2, "new"));
  std::vector<SessionInfo> left = gen->ListSessions().sessions;
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].id, "mid");
  EXPECT_EQ(left[1].id, "new");
  EXPECT_TRUE(left[0].in_host && left[1].in_host);
  EXPECT_EQ(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kSessionDropped)],
            5 * gen->host_store()->num_layers() * gen->host_store()->num_kv_heads());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  // 15 blocks of KV: more than the whole store.
  RunAlone(*gen, InSession(Tokens(239, 5), 2, "huge"));
  left = gen->ListSessions().sessions;
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(left[0].id, "huge");
  EXPECT_FALSE(left[0].in_host);
  EXPECT_EQ(left[0].tokens, 240);
  EXPECT_TRUE(left[1].in_host && left[2].in_host);
  EXPECT_EQ(gen->kv_blocks_used(), 15);
  EXPECT_EQ(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kSessionDropped)],
            5 * gen->host_store()->num_layers() * gen->host_store()->num_kv_heads());
  for (const char* id : {"huge", "mid", "new"}) ASSERT_TRUE(gen->DeleteSession(id).ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
}

// A dense turn reusing host pages copies them into blocks of its own, so admission counts every
// block it needs, cached or not: with 6 of 12 blocks held by a running request, the session's
// next turn (100 tokens, 80 of them in the host store) needs 7 and waits.
TEST(SessionTest, ADenseTurnReloadingHostPagesNeedsBlocksForThemToo) {
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()),
                               Options(false, false, 12 * kPage, 4096))
                 .value();
  const std::vector<int32_t> first = Tokens(79, 1);
  const Turn turn1 = RunAlone(*gen, InSession(first, 2, "s"));  // 80 tokens kept, in the host
  ASSERT_TRUE(gen->ListSessions().sessions[0].in_host);
  auto big = gen->Add(Greedy(Tokens(80, 2), 100)).value();
  std::vector<SequenceOutput> outputs;
  ASSERT_TRUE(gen->Step(&outputs).ok());
  ASSERT_TRUE(gen->Step(&outputs).ok());
  ASSERT_EQ(gen->kv_blocks_used(), 6);
  const std::vector<int32_t> next = Concat(Concat(first, turn1.tokens), Tokens(19, 3));
  ASSERT_EQ(next.size(), 100u);
  EXPECT_FALSE(gen->HasRoomFor(InSession(next, 4, "s")));
  SequenceOutput cancelled;
  ASSERT_TRUE(gen->Cancel(big, &cancelled).ok());
  EXPECT_TRUE(gen->HasRoomFor(InSession(next, 4, "s")));
  EXPECT_EQ(RunAlone(*gen, InSession(next, 4, "s")).cached, 80);
  ASSERT_TRUE(gen->DeleteSession("s").ok());
  EXPECT_EQ(gen->host_pages_used(), 0);
}

// A dense session turn that reloads host pages can be preempted like any dense sequence: its
// blocks are parked in the pool's index and the host hit unlocked; it resumes and answers as
// alone. A 12-block pool: A (20 + 100 tokens, 8 blocks at the end) runs; S, the session's next
// turn (100 tokens, 80 reloaded from the host store, + 30: 9 blocks), starts second, so it is
// the one preempted when A grows.
TEST(PreemptionTest, ADenseTurnReloadedFromHostIsPreemptedAndResumedExactly) {
  const std::string model = TestModelDir(AllTestModels().front());
  auto gen = Generator::Create(model, Options(false, false, 12 * kPage, 4096)).value();
  const std::vector<int32_t> first = Tokens(79, 1);
  const Turn turn1 = RunAlone(*gen, InSession(first, 2, "s"));
  ASSERT_TRUE(gen->ListSessions().sessions[0].in_host);
  const GenerationRequest a = Greedy(Tokens(20, 2), 100);
  const GenerationRequest s_turn =
      InSession(Concat(Concat(first, turn1.tokens), Tokens(19, 3)), 30, "s");
  auto results = gen->GenerateAll({a, s_turn});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_GT(gen->preemptions(), 0);
  const GenerationRequest requests[] = {a, s_turn};
  for (int i = 0; i < 2; ++i) {
    GenerationRequest alone_request = requests[i];
    alone_request.session_id.clear();
    auto alone = Generator::Create(model, Options(false)).value();
    EXPECT_EQ((*results)[i].tokens, alone->GenerateAll({alone_request}).value()[0].tokens) << i;
  }
  ASSERT_TRUE(gen->ListSessions().sessions[0].in_host);
  ASSERT_TRUE(gen->DeleteSession("s").ok());
  EXPECT_EQ(gen->kv_blocks_used(), 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
}

// A sparse request's device slots come from the KV pool; host pages cached by idle sparse
// sessions are no pool blocks, so they do not make room for them. With the pool held by a dense
// request, a session-less sparse request (kv_cache.prefix_cache off) has no room.
TEST(SessionTest, CachedHostPagesAreNotCountedAsFreePoolBlocks) {
  GeneratorOptions o = Options(true, false, 12 * kPage);
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), o).value();
  RunAlone(*gen, InSession(Tokens(150, 1), 2, "idle"));  // ~9 blocks of host pages per head
  ASSERT_GT(gen->ListSessions().sessions[0].tokens, 0);
  GenerationRequest dense = Greedy(Tokens(150, 2), 20);
  dense.sparse.mode = SparseMode::kDense;
  auto id = gen->Add(dense).value();
  std::vector<SequenceOutput> outputs;
  ASSERT_TRUE(gen->Step(&outputs).ok());
  ASSERT_GE(gen->kv_blocks_used(), 10);
  const GenerationRequest sparse = Greedy(Tokens(100, 3), 8);
  EXPECT_FALSE(gen->HasRoomFor(sparse));
  EXPECT_EQ(gen->Add(sparse).status().code(), absl::StatusCode::kResourceExhausted);
  SequenceOutput cancelled;
  ASSERT_TRUE(gen->Cancel(id, &cancelled).ok());
  EXPECT_TRUE(gen->HasRoomFor(sparse));
  ASSERT_TRUE(gen->DeleteSession("idle").ok());
}

std::vector<std::string> IdsOf(const PrefixCache::SessionPage& page) {
  std::vector<std::string> ids;
  for (const SessionInfo& s : page.sessions) ids.push_back(s.id);
  return ids;
}

// What the session gauges must read: the sessions' count and the sum of their KV bytes.
void ExpectCountersMatchTheSessions(const Generator& gen) {
  const PrefixCache::SessionPage all = gen.ListSessions();
  int64_t bytes = 0;
  for (const SessionInfo& s : all.sessions) bytes += s.bytes;
  EXPECT_EQ(gen.prefix_cache_counters().sessions, static_cast<int64_t>(all.sessions.size()));
  EXPECT_EQ(gen.prefix_cache_counters().session_bytes, bytes);
}

// kv_cache.max_sessions: a new session past the limit drops the least recently used idle one
// (sessions holding no KV once piled up until their TTL: 90,000 were kept); when every session
// has a request running, the new one is refused.
TEST(SessionTest, PastMaxSessionsANewSessionDropsTheLeastRecentlyUsedIdleOne) {
  GeneratorOptions o = Options(false);
  o.prefix_cache.max_sessions = 3;
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), o).value();
  int seed = 0;
  for (const char* id : {"a", "b", "c"}) RunAlone(*gen, InSession(Tokens(40, ++seed), 4, id));
  RunAlone(*gen, InSession(Tokens(40, ++seed), 4, "a"));  // b is now the least recently used
  ExpectCountersMatchTheSessions(*gen);
  RunAlone(*gen, InSession(Tokens(40, ++seed), 4, "d"));
  EXPECT_THAT(IdsOf(gen->ListSessions()), ::testing::ElementsAre("a", "c", "d"));
  EXPECT_GT(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kSessionLimit)],
            0);
  ExpectCountersMatchTheSessions(*gen);
  // A turn of an existing session is no new session: nothing is dropped.
  RunAlone(*gen, InSession(Tokens(40, ++seed), 4, "c"));
  EXPECT_THAT(IdsOf(gen->ListSessions()), ::testing::ElementsAre("a", "c", "d"));

  std::vector<uint64_t> running;
  for (const char* id : {"a", "c", "d"}) {
    running.push_back(gen->Add(InSession(Tokens(40, ++seed), 8, id)).value());
  }
  auto refused = gen->Add(InSession(Tokens(40, ++seed), 8, "e"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("kv_cache.max_sessions (3)"));
  for (uint64_t id : running) {
    SequenceOutput out;
    ASSERT_TRUE(gen->Cancel(id, &out).ok());
  }
  for (const char* id : {"a", "c", "d"}) ASSERT_TRUE(gen->DeleteSession(id).ok());
  ExpectCountersMatchTheSessions(*gen);
  EXPECT_EQ(gen->prefix_cache_counters().session_bytes, 0);
}

// ListSessions comes in pages in id order; a page continues after the id it is given, whether
// or not that session still exists.
TEST(SessionTest, SessionsAreListedInPagesInIdOrder) {
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), Options(false)).value();
  for (const char* id : {"e", "a", "d", "b", "c"}) RunAlone(*gen, InSession(Tokens(20, 1), 2, id));
  PrefixCache::SessionPage page = gen->ListSessions("", 2);
  EXPECT_THAT(IdsOf(page), ::testing::ElementsAre("a", "b"));
  EXPECT_TRUE(page.more);
  ASSERT_TRUE(gen->DeleteSession("b").ok());
  page = gen->ListSessions("b", 2);
  EXPECT_THAT(IdsOf(page), ::testing::ElementsAre("c", "d"));
  EXPECT_TRUE(page.more);
  page = gen->ListSessions("d", 2);
  EXPECT_THAT(IdsOf(page), ::testing::ElementsAre("e"));
  EXPECT_FALSE(page.more);
  page = gen->ListSessions("d", 1);
  EXPECT_THAT(IdsOf(page), ::testing::ElementsAre("e"));
  EXPECT_FALSE(page.more);  // nothing after the last one: no empty last page
  EXPECT_THAT(IdsOf(gen->ListSessions("bb", 1)), ::testing::ElementsAre("c"));
  EXPECT_TRUE(gen->ListSessions("e", 5).sessions.empty());
  ExpectCountersMatchTheSessions(*gen);
}

TEST(SessionTest, DeleteIsNotFoundForAnUnknownIdAndRefusedWhileRunning) {
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), Options(false)).value();
  EXPECT_EQ(gen->DeleteSession("nope").code(), absl::StatusCode::kNotFound);
  auto id = gen->Add(InSession(Tokens(40, 1), 8, "s")).value();
  EXPECT_EQ(gen->DeleteSession("s").code(), absl::StatusCode::kFailedPrecondition);
  // A second turn while the first runs is refused, and the first is unaffected.
  auto second = gen->Add(InSession(Tokens(40, 1), 8, "s"));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("'s'"));
  SequenceOutput out;
  ASSERT_TRUE(gen->Cancel(id, &out).ok());
  ASSERT_TRUE(gen->DeleteSession("s").ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

TEST(SessionTest, IdleSessionsExpireAfterTheirTtl) {
  GeneratorOptions o = Options(false);
  o.prefix_cache.session_ttl = absl::Seconds(60);
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), o).value();
  RunAlone(*gen, InSession(Tokens(40, 1), 8, "s"));
  EXPECT_GT(gen->kv_pool().used_blocks(), 0);
  const absl::Time expiry = gen->NextSessionExpiry();
  EXPECT_LE(expiry, absl::Now() + absl::Seconds(60));
  EXPECT_EQ(gen->ExpireSessions(expiry - absl::Seconds(1)), 0);
  EXPECT_EQ(gen->ExpireSessions(expiry), 1);
  EXPECT_TRUE(gen->ListSessions().sessions.empty());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_EQ(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kSessionTtl)],
            (40 + 8 - 1 + kPage - 1) / kPage);  // the partly filled last block too
}

// A pool of 16 blocks: two idle sessions of 5 blocks each leave 6 free; a request needing 9
// drops the least recently used session only, and is admitted.
TEST(SessionTest, IdleSessionsAreDroppedLeastRecentlyUsedFirstForRoom) {
  auto gen =
      Generator::Create(TestModelDir(AllTestModels().front()), Options(false, false, 16 * kPage))
          .value();
  RunAlone(*gen, InSession(Tokens(80, 1), 1, "old"));  // 80 tokens of KV: 5 blocks
  RunAlone(*gen, InSession(Tokens(80, 2), 1, "new"));
  EXPECT_EQ(gen->kv_blocks_used(), 10);
  const GenerationRequest big = Greedy(Tokens(100, 3), 40);  // 140 tokens: 9 blocks
  EXPECT_TRUE(gen->HasRoomFor(big));
  RunAlone(*gen, big);
  const std::vector<SessionInfo> left = gen->ListSessions().sessions;
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].id, "new");
  EXPECT_EQ(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kSessionDropped)],
            5);
  // Nothing can make room for more than the pool minus what the running request holds.
  ASSERT_TRUE(gen->DeleteSession("new").ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

// With kv_cache.prefix_cache, requests without a session reuse each other's pages; the cached
// pages count as free for admission and leave least recently used first when space is needed.
TEST(PrefixCacheTest, SessionlessRequestsShareCachedPagesUntilSpaceIsNeeded) {
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()),
                               Options(false, /*sessionless=*/true, 16 * kPage))
                 .value();
  const std::vector<int32_t> shared = Tokens(64, 5);
  const Turn first = RunAlone(*gen, Greedy(Concat(shared, Tokens(3, 1)), 2));
  EXPECT_EQ(first.cached, 0);
  const Turn second = RunAlone(*gen, Greedy(Concat(shared, Tokens(3, 2)), 2));
  EXPECT_EQ(second.cached, 64);
  EXPECT_EQ(gen->kv_blocks_used(), 0);
  EXPECT_GT(gen->kv_blocks_cached(), 0);
  // A request needing the whole pool evicts every cached page.
  const Turn whole = RunAlone(*gen, Greedy(Tokens(200, 9), 56));
  EXPECT_EQ(whole.tokens.size(), 56u);
  EXPECT_GT(gen->prefix_cache_counters()
                .evicted_pages[static_cast<int>(EvictionReason::kCapacity)],
            0);
}

// Admission takes what a request needs now; when decode outgrows the pool, the youngest
// sequences are preempted and resumed later. A pool sized for two whole requests serves six
// submitted together, each exactly as if it ran alone.
TEST(PreemptionTest, APoolForTwoServesSixWithTheirSoloOutputs) {
  const std::string model = TestModelDir(AllTestModels().front());
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = Greedy(Tokens(20 + i, 40 + i), 44);  // <= 70 tokens: 5 blocks
    if (i == 2) r.session_id = "agent";  // a session's turn survives preemption too
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> solo;
  for (const GenerationRequest& r : requests) {
    auto alone = Generator::Create(model, Options(false)).value();
    solo.push_back(alone->GenerateAll({r}).value()[0].tokens);
  }
  auto gen = Generator::Create(model, Options(false, false, 10 * kPage)).value();
  auto results = gen->GenerateAll(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*results)[i].tokens, solo[i]) << "request " << i;
  EXPECT_GT(gen->preemptions(), 0);
  // The session's KV was kept, unless later requests needed its room (it was idle by then).
  const int64_t dropped = gen->prefix_cache_counters()
                              .evicted_pages[static_cast<int>(EvictionReason::kSessionDropped)];
  if (gen->ListSessions().sessions.empty()) {
    EXPECT_GT(dropped, 0);
  } else {
    ASSERT_TRUE(gen->DeleteSession("agent").ok());
  }
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

// Requests that share a prefix (so resumes copy a tail block), some in sessions, in a pool that
// holds only a few: preemption churns, and every request must still finish. Two bugs made
// resumes fail with RESOURCE_EXHAUSTED here (issue 32, item 5): making room counted a tail block
// the resuming request itself held as freed, and a session whose turn was preempted kept its
// last turn's KV out of anyone's reach, though the room check counted it as reclaimable.
TEST(PreemptionTest, UnderChurnWithSharedPrefixesAndSessionsEveryRequestFinishes) {
  const std::string model = TestModelDir(AllTestModels().front());
  const std::vector<int32_t> shared = Tokens(37, 5);  // 2 blocks and a tail
  for (int seed = 1; seed <= 12; ++seed) {
    for (bool sessionless : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", sessionless " << sessionless);
      std::mt19937 rng(seed);
      auto gen = Generator::Create(model, Options(false, sessionless, 12 * kPage)).value();
      std::deque<GenerationRequest> waiting;
      for (int i = 0; i < 24; ++i) {
        const bool share = rng() % 2 == 0;
        std::vector<int32_t> prompt = share ? Concat(shared, Tokens(1 + rng() % 40, 100 + i))
                                            : Tokens(2 + rng() % 60, 200 + i);
        GenerationRequest r = Greedy(prompt, 10 + rng() % 90);
        if (rng() % 4 == 0) r.session_id = "s" + std::to_string(rng() % 3);
        waiting.push_back(std::move(r));
      }
      std::map<uint64_t, std::string> session_of;  // running requests' sessions
      int finished = 0;
      while (!waiting.empty() || gen->HasWork()) {
        // In order, as the engine admits: a session's next turn waits for its last.
        while (!waiting.empty()) {
          const GenerationRequest& r = waiting.front();
          const bool session_busy =
              std::any_of(session_of.begin(), session_of.end(),
                          [&](const auto& e) { return e.second == r.session_id; });
          if (!r.session_id.empty() && session_busy) break;
          absl::StatusOr<uint64_t> id = gen->Add(r);
          if (!id.ok() && absl::IsResourceExhausted(id.status()) && gen->HasWork()) break;
          ASSERT_TRUE(id.ok()) << id.status();
          if (!r.session_id.empty()) session_of[*id] = r.session_id;
          waiting.pop_front();
        }
        std::vector<SequenceOutput> outputs;
        ASSERT_TRUE(gen->Step(&outputs).ok());
        for (const SequenceOutput& o : outputs) {
          EXPECT_TRUE(o.error.ok()) << "request " << o.id << ": " << o.error;
          if (!o.error.ok() || o.finish != FinishReason::kNone) {
            ++finished;
            session_of.erase(o.id);
          }
        }
      }
      EXPECT_EQ(finished, 24);
      EXPECT_GT(gen->preemptions(), 0);
    }
  }
}

// A preempted sequence's full pages stay cached while nothing else needs them, so resuming
// recomputes less than everything. Three requests of 6 blocks each in 14 blocks: the two that
// keep running need 12, so 2 of the third's parked blocks survive until it resumes.
TEST(PreemptionTest, ResumeReusesParkedPagesWhenTheyWereNotEvicted) {
  const std::string model = TestModelDir(AllTestModels().front());
  auto gen = Generator::Create(model, Options(false, false, 14 * kPage)).value();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(Greedy(Tokens(30, 60 + i), 60));
  auto results = gen->GenerateAll(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 3; ++i) {
    auto alone = Generator::Create(model, Options(false)).value();
    EXPECT_EQ((*results)[i].tokens, alone->GenerateAll({requests[i]}).value()[0].tokens) << i;
  }
  EXPECT_GT(gen->preemptions(), 0);
  EXPECT_GT(gen->resumed_cached_tokens(), 0);
  EXPECT_EQ(gen->kv_blocks_used(), 0);
}

// The youngest sequence can be a dense prompt still in chunked prefill: it is preempted like a
// decoding one (its KV is complete up to what it prefilled). An 11-block pool: A (31 + 20
// tokens) and B (130 + 4, prefilled 48 tokens a step) fill it; A's third step needs a block
// while B is mid-prefill, so B gives its blocks back and resumes once A is done.
TEST(PreemptionTest, ADenseRequestMidPrefillIsPreemptedAndResumedExactly) {
  const std::string model = TestModelDir(AllTestModels().front());
  const std::vector<GenerationRequest> requests = {Greedy(Tokens(31, 90), 20),
                                                   Greedy(Tokens(130, 91), 4)};
  auto gen = Generator::Create(model, Options(false, false, 11 * kPage)).value();
  auto results = gen->GenerateAll(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 2; ++i) {
    auto alone = Generator::Create(model, Options(false)).value();
    EXPECT_EQ((*results)[i].tokens, alone->GenerateAll({requests[i]}).value()[0].tokens) << i;
  }
  EXPECT_GT(gen->preemptions(), 0);
  EXPECT_EQ(gen->kv_blocks_used(), 0);
  // Neither has a session (and kv_cache.prefix_cache is off): what B parked is gone too.
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

// A turn shorter than a page leaves nothing to reuse (a tail only follows a whole page), so its
// session caches nothing and holds no block.
TEST(SessionTest, ATurnShorterThanAPageCachesNothing) {
  auto gen = Generator::Create(TestModelDir(AllTestModels().front()), Options(false)).value();
  RunAlone(*gen, InSession(Tokens(5, 1), 3, "short"));
  const std::vector<SessionInfo> sessions = gen->ListSessions().sessions;
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].tokens, 0);
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  ASSERT_TRUE(gen->DeleteSession("short").ok());
}

// Six sparse requests at full budget (more than any request's length), 20-25 prompt tokens and
// 395-400 to generate, with each one's solo output; Crowded() is a generator whose host store
// holds two of them whole (2 x 27 pages per head).
struct SparseGrowthCase {
  SparseGrowthCase() {
    options.sparse.budget_tokens = 1024;
    for (int i = 0; i < 6; ++i) requests.push_back(Greedy(Tokens(20 + i, 70 + i), 400 - i));
    for (const GenerationRequest& r : requests) {
      auto alone = Generator::Create(model, options).value();
      solo.push_back(alone->GenerateAll({r}).value()[0].tokens);
    }
  }
  std::unique_ptr<Generator> Crowded() const {
    GeneratorOptions o = options;
    o.host_capacity_tokens = 2 * 27 * kPage;
    return Generator::Create(model, o).value();
  }
  const std::string model = TestModelDir(AllTestModels().front());
  GeneratorOptions options = Options(true);
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> solo;
};

// Sparse requests take host pages as they decode (prompt + 256 tokens, then 256 more at a time),
// and when the host store runs out the youngest decoding one is preempted: its whole pages are
// parked in the sparse prefix index, and it resumes by prefilling what eviction took. A store
// for two whole requests (2 x 27 pages per head) admits three at once and serves six, each
// exactly as alone (at full budget sparse equals dense, so a resumed request's KV, computed by
// prefill rather than decode, is the same).
TEST(PreemptionTest, SparseRequestsGrowTheirHostPagesAndAreResumedExactly) {
  const SparseGrowthCase c;
  auto gen = c.Crowded();
  const std::vector<GenerationRequest>& requests = c.requests;
  const std::vector<std::vector<int32_t>>& solo = c.solo;
  EXPECT_TRUE(gen->HasRoomFor(requests[0])) << "admission by current need";
  auto results = gen->GenerateAll(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*results)[i].tokens, solo[i]) << "request " << i;
  EXPECT_GT(gen->preemptions(), 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
  EXPECT_EQ(gen->kv_blocks_used(), 0);
}

// Once a sparse request has been preempted, every host page allocation fails (an injected
// fault): requests that need no more pages finish exactly as alone, those that do (a growth, or
// the preempted one's resume) end INTERNAL alone, and nothing is held afterwards. The resume's
// failure must end that request, not the engine.
TEST(PreemptionTest, AResumeOrGrowthThatCannotAllocateFailsThatRequestOnly) {
  if (!kFaultInjection) GTEST_SKIP() << "built without SPECULA_FAULT_INJECTION";
  const SparseGrowthCase c;
  auto gen = c.Crowded();
  const std::vector<GenerationRequest>& requests = c.requests;
  const std::vector<std::vector<int32_t>>& solo = c.solo;
  std::map<uint64_t, size_t> index;
  std::vector<std::vector<int32_t>> tokens(requests.size());
  std::vector<absl::Status> ends(requests.size());
  size_t next = 0, ended = 0;
  bool armed = false;
  struct Disarm {
    ~Disarm() { DisarmFaults(); }
  } disarm;  // also when an assertion returns early
  while (ended < requests.size()) {
    while (next < requests.size()) {
      auto id = gen->Add(requests[next]);
      if (absl::IsResourceExhausted(id.status())) break;
      if (!id.ok()) {  // admission's allocation failed: refused at once
        ends[next++] = id.status();
        ++ended;
        continue;
      }
      index[*id] = next++;
    }
    if (!armed && gen->preemptions() > 0) {
      ArmFault(Fault::kHostPageAlloc, 1 << 20);
      armed = true;
    }
    std::vector<SequenceOutput> outputs;
    ASSERT_TRUE(gen->Step(&outputs).ok());
    for (const SequenceOutput& out : outputs) {
      const size_t i = index.at(out.id);
      tokens[i].insert(tokens[i].end(), out.tokens.begin(), out.tokens.end());
      if (!out.error.ok() || out.finish != FinishReason::kNone) {
        ends[i] = out.error;
        ++ended;
      }
    }
  }
  ASSERT_TRUE(armed) << "nothing was preempted";
  int resumes_failed = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (ends[i].ok()) {
      EXPECT_EQ(tokens[i], solo[i]) << "request " << i;
      continue;
    }
    EXPECT_EQ(ends[i].code(), absl::StatusCode::kInternal) << ends[i];
    EXPECT_THAT(std::string(ends[i].message()), ::testing::HasSubstr("injected"));
    resumes_failed += absl::StrContains(ends[i].message(), "resuming after preemption") ? 1 : 0;
  }
  EXPECT_GT(resumes_failed, 0);
  EXPECT_EQ(gen->host_pages_used(), 0);
  EXPECT_EQ(gen->kv_blocks_used(), 0);
}

}  // namespace
}  // namespace specula
