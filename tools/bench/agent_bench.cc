#include "tools/bench/agent_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/generate/generator.h"
#include "tools/bench/serve_stats.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<int32_t> Ids(int n, uint64_t seed) {
  std::vector<int32_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = 1 + static_cast<int32_t>(x % 30000);
  }
  return v;
}

struct Conversation {
  std::vector<int32_t> prompt;
  std::string session;
  int turn = 0;
  bool running = false;
  uint64_t id = 0;
  Clock::time_point ready;
  Clock::time_point submitted;
  bool got_first = false;
  std::vector<int32_t> answer;
};

struct TurnStats {
  std::vector<double> ttft;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
};

struct ModeResult {
  std::vector<TurnStats> turns;
  double wall_seconds = 0;
  int64_t peak_kv_bytes = 0;      // KV pool + host store pages held, cached ones included
  int64_t session_bytes = 0;      // at the end
  int64_t pool_bytes_at_end = 0;  // KV-pool blocks held at the end (sessions in the pool)
};

class AgentRun {
 public:
  AgentRun(Generator& g, const AgentBenchOptions& o, const std::string& mode)
      : g_(g), o_(o), result_() {
    result_.turns.resize(o.turns);
    const std::vector<int32_t> system = Ids(o.system_tokens, 1);
    convs_.resize(o.conversations);
    for (int c = 0; c < o.conversations; ++c) {
      convs_[c].prompt = system;
      const std::vector<int32_t> user = Ids(o.user_tokens, 100 + c);
      convs_[c].prompt.insert(convs_[c].prompt.end(), user.begin(), user.end());
      if (mode != "none" && mode != "prefix") convs_[c].session = absl::StrCat("agent-", c);
      convs_[c].ready = Clock::now();
    }
  }

  absl::StatusOr<ModeResult> Run() {
    const Clock::time_point start = Clock::now();
    while (Pending()) {
      if (absl::Status s = AdmitReady(); !s.ok()) return s;
      if (g_.HasWork()) {
        if (absl::Status s = StepOnce(); !s.ok()) return s;
      } else {
        std::this_thread::sleep_until(NextReady());
      }
    }
    result_.wall_seconds = Seconds(Clock::now() - start);
    result_.session_bytes = g_.prefix_cache_counters().session_bytes;
    result_.pool_bytes_at_end =
        static_cast<int64_t>(g_.kv_pool().used_blocks()) * g_.kv_pool().bytes_per_block();
    return result_;
  }

 private:
  bool Pending() const {
    return std::any_of(convs_.begin(), convs_.end(),
                       [&](const Conversation& c) { return c.turn < o_.turns; });
  }

  Clock::time_point NextReady() const {
    Clock::time_point next = Clock::time_point::max();
    for (const Conversation& c : convs_) {
      if (!c.running && c.turn < o_.turns) next = std::min(next, c.ready);
    }
    return next;
  }

  absl::Status AdmitReady() {
    const Clock::time_point now = Clock::now();
    for (Conversation& c : convs_) {
      if (c.running || c.turn >= o_.turns || c.ready > now) continue;
      GenerationRequest r;
      r.prompt = c.prompt;
      r.sampling.temperature = 0;
      r.stopping.max_tokens = o_.output_tokens;
      r.stopping.ignore_eos = true;
      r.session_id = c.session;
      if (!g_.HasRoomFor(r)) continue;
      absl::StatusOr<uint64_t> id = g_.Add(std::move(r));
      if (!id.ok()) return id.status();
      c.id = *id;
      c.running = true;
      c.got_first = false;
      c.submitted = now;
      c.answer.clear();
      TurnStats& t = result_.turns[c.turn];
      t.prompt_tokens += static_cast<int64_t>(c.prompt.size());
      t.cached_tokens += g_.CachedPromptTokens(*id);
      by_id_[*id] = &c;
    }
    return absl::OkStatus();
  }

  absl::Status StepOnce() {
    outputs_.clear();
    if (absl::Status s = g_.Step(&outputs_); !s.ok()) return s;
    const Clock::time_point now = Clock::now();
    result_.peak_kv_bytes = std::max(result_.peak_kv_bytes, HeldBytes());
    for (const SequenceOutput& out : outputs_) {
      Conversation& c = *by_id_.at(out.id);
      if (!c.got_first && !out.tokens.empty()) {
        c.got_first = true;
        result_.turns[c.turn].ttft.push_back(Seconds(now - c.submitted));
      }
      c.answer.insert(c.answer.end(), out.tokens.begin(), out.tokens.end());
      if (out.finish == FinishReason::kNone) continue;
      by_id_.erase(out.id);
      c.running = false;
      c.prompt.insert(c.prompt.end(), c.answer.begin(), c.answer.end());
      const std::vector<int32_t> tool =
          Ids(o_.tool_tokens, 1000 + 37 * (&c - convs_.data()) + c.turn);
      c.prompt.insert(c.prompt.end(), tool.begin(), tool.end());
      ++c.turn;
      c.ready = now + std::chrono::milliseconds(o_.think_ms);
    }
    return absl::OkStatus();
  }

  int64_t HeldBytes() const {
    int64_t bytes =
        static_cast<int64_t>(g_.kv_pool().used_blocks()) * g_.kv_pool().bytes_per_block();
    if (const HostKvStore* host = g_.host_store()) {
      bytes += static_cast<int64_t>(host->used_pages()) * static_cast<int64_t>(host->page_bytes());
    }
    return bytes;
  }

  Generator& g_;
  const AgentBenchOptions& o_;
  ModeResult result_;
  std::vector<Conversation> convs_;
  std::map<uint64_t, Conversation*> by_id_;
  std::vector<SequenceOutput> outputs_;
};

absl::StatusOr<ModeResult> RunMode(const std::string& model_dir, const AgentBenchOptions& o,
                                   const std::string& mode) {
  GeneratorOptions go;
  go.threads = o.threads;
  go.device = o.device;
  const int64_t context =
      o.system_tokens + o.user_tokens + int64_t{o.turns} * (o.output_tokens + o.tool_tokens);
  // Room for every conversation's turn and its cached last turn twice over.
  go.kv_cache_tokens = 4 * context * o.conversations;
  go.max_running = o.conversations;
  go.prefill_chunk_tokens = 512;
  go.prefix_cache.cache_sessionless = mode == "prefix";
  // Sessions offloaded to a host store as large as the pool, the pool left to running turns.
  if (mode == "offload") go.host_capacity_tokens = go.kv_cache_tokens;
  absl::StatusOr<std::unique_ptr<Generator>> g = Generator::Create(model_dir, go);
  if (!g.ok()) return g.status();
  return AgentRun(**g, o, mode).Run();
}

// TTFT of `repeats` requests run alone, each a cached `context` followed by `suffix` new tokens
// (their own, so only the context is reused): the median, in seconds.
absl::StatusOr<double> SuffixTtft(Generator& g, int context, int suffix, int repeats) {
  const std::vector<int32_t> prefix = Ids(context, 7);
  std::vector<SequenceOutput> outputs;
  auto first_token = [&](std::vector<int32_t> prompt) -> absl::StatusOr<double> {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.stopping.max_tokens = 1;
    r.stopping.ignore_eos = true;
    const Clock::time_point start = Clock::now();
    absl::StatusOr<uint64_t> id = g.Add(std::move(r));
    if (!id.ok()) return id.status();
    while (g.HasWork()) {
      outputs.clear();
      if (absl::Status s = g.Step(&outputs); !s.ok()) return s;
    }
    return Seconds(Clock::now() - start);
  };
  if (context > 0) {
    // Caches the context (kv_cache.prefix_cache), as an earlier turn would have.
    if (absl::StatusOr<double> warm = first_token(prefix); !warm.ok()) return warm.status();
  }
  std::vector<double> ttft;
  for (int i = 0; i < repeats; ++i) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> own = Ids(suffix, 100 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    absl::StatusOr<double> t = first_token(std::move(prompt));
    if (!t.ok()) return t.status();
    ttft.push_back(*t);
  }
  return Median(std::move(ttft));
}

int RunSuffixProbe(const std::string& model_dir, const AgentBenchOptions& o) {
  const int first = o.system_tokens + o.user_tokens;
  const int last = first + (o.turns - 1) * (o.output_tokens + o.tool_tokens);
  const int suffix = o.tool_tokens + 1;  // a turn's new tokens: the tool result, the last answer
  GeneratorOptions go;
  go.threads = o.threads;
  go.device = o.device;
  go.kv_cache_tokens = 4 * (last + suffix);
  go.prefill_chunk_tokens = 512;
  go.prefix_cache.cache_sessionless = true;
  absl::StatusOr<std::unique_ptr<Generator>> g = Generator::Create(model_dir, go);
  if (!g.ok()) {
    std::cerr << "specula-bench agent: suffix probe: " << g.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "\nTTFT of %d new tokens after a cached prefix, one request at a time (median of %d):\n\n"
      "| cached prefix tokens | TTFT ms | / no prefix |\n|---|---|---|\n",
      suffix, o.suffix_probe_repeats);
  double base = 0;
  std::vector<int> contexts = {0, first};
  if (last != first) contexts.push_back(last);
  for (int context : contexts) {
    absl::StatusOr<double> t = SuffixTtft(**g, context, suffix, o.suffix_probe_repeats);
    if (!t.ok()) {
      std::cerr << "specula-bench agent: suffix probe: " << t.status() << "\n";
      return 1;
    }
    if (context == 0) base = *t;
    std::cout << absl::StrFormat("| %d | %.1f | %.2f |\n", context, *t * 1e3, *t / base);
  }
  return 0;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

void Print(const AgentBenchOptions& o, const std::map<std::string, ModeResult>& results) {
  std::cout << "| turn |";
  for (const std::string& m : o.modes) {
    std::cout << absl::StrFormat(" %s: prefilled tokens | %s: TTFT ms |", m, m);
  }
  std::cout << "\n|---|";
  for (size_t i = 0; i < o.modes.size(); ++i) std::cout << "---|---|";
  std::cout << "\n";
  for (int t = 0; t < o.turns; ++t) {
    std::cout << "| " << t + 1 << " |";
    for (const std::string& m : o.modes) {
      const TurnStats& s = results.at(m).turns[t];
      std::cout << absl::StrFormat(
          " %.0f | %.1f |",
          static_cast<double>(s.prompt_tokens - s.cached_tokens) / o.conversations,
          Mean(s.ttft) * 1e3);
    }
    std::cout << "\n";
  }
  std::cout << "\n| mode | TTFT turn " << o.turns
            << " / turn 1 | prefix hit ratio | wall s | peak KV held MB | session KV MB at end "
               "| KV-pool MB at end |\n|---|---|---|---|---|---|---|\n";
  for (const std::string& m : o.modes) {
    const ModeResult& r = results.at(m);
    int64_t prompt = 0, cached = 0;
    for (const TurnStats& s : r.turns) prompt += s.prompt_tokens, cached += s.cached_tokens;
    std::cout << absl::StrFormat("| %s | %.2f | %.3f | %.2f | %.1f | %.1f | %.1f |\n", m,
                                 Mean(r.turns.back().ttft) / Mean(r.turns.front().ttft),
                                 prompt > 0 ? static_cast<double>(cached) / prompt : 0.0,
                                 r.wall_seconds, r.peak_kv_bytes / 1e6, r.session_bytes / 1e6,
                                 r.pool_bytes_at_end / 1e6);
  }
}

}  // namespace

int RunAgentBench(const AgentBenchOptions& o) {
  namespace fs = std::filesystem;
  for (const std::string& m : o.modes) {
    if (m != "none" && m != "prefix" && m != "session" && m != "offload") {
      std::cerr << "specula-bench agent: --modes: unknown mode '" << m
                << "' (none|prefix|session|offload)\n";
      return 2;
    }
  }
  if (o.conversations < 1 || o.turns < 1 || o.system_tokens < 0 || o.user_tokens < 1 ||
      o.tool_tokens < 0 || o.output_tokens < 1 || o.think_ms < 0 || o.suffix_probe_repeats < 0) {
    std::cerr << "specula-bench agent: --conversations, --turns, --user-tokens and "
                 "--output-tokens must be >= 1, the others >= 0\n";
    return 2;
  }
  std::string model_dir = o.model_dir;
  const fs::path work = o.work_dir.empty()
                            ? fs::temp_directory_path() / absl::StrCat("specula-bench-", getpid())
                            : fs::path(o.work_dir);
  if (model_dir.empty()) {
    TinyModelOptions t;
    t.out_dir = (work / "100m").string();
    t.arch = TinyArch::kLlama3;
    t.preset = "100m";
    if (absl::Status s = WriteTinyModel(t); !s.ok()) {
      std::cerr << "specula-bench agent: " << s << "\n";
      return 1;
    }
    model_dir = t.out_dir;
  }
  std::cout << absl::StrFormat(
      "model %s on %s; %d conversations x %d turns; system %d + user %d tokens, then %d output "
      "+ %d tool tokens per turn; think %d ms; TTFT is the mean over conversations\n\n",
      o.model_dir.empty() ? "100m (generated)" : model_dir, DeviceKindName(o.device),
      o.conversations, o.turns, o.system_tokens, o.user_tokens, o.output_tokens, o.tool_tokens,
      o.think_ms);
  std::map<std::string, ModeResult> results;
  int rc = 0;
  for (const std::string& m : o.modes) {
    absl::StatusOr<ModeResult> r = RunMode(model_dir, o, m);
    if (!r.ok()) {
      std::cerr << "specula-bench agent: " << m << ": " << r.status() << "\n";
      rc = 1;
      break;
    }
    results[m] = *std::move(r);
  }
  if (rc == 0 && !o.modes.empty()) Print(o, results);
  if (rc == 0 && o.suffix_probe_repeats > 0) rc = RunSuffixProbe(model_dir, o);
  if (o.work_dir.empty()) fs::remove_all(work);
  return rc;
}

}  // namespace specula
