#include "tools/bench/serve_client.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tools/bench/serve_procstat.h"

namespace specula {
namespace {

namespace pb = ::specula::v1;
using Clock = BenchClock;

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// Counts requests in flight for the dispatcher; the calls' OnDone releases them.
class Slots {
 public:
  explicit Slots(int32_t cap) : cap_(cap) {}
  void Acquire() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return cap_ <= 0 || in_flight_ < cap_; });
    ++in_flight_;
  }
  void Release() {
    std::lock_guard lock(mu_);
    --in_flight_;
    ++finished_;
    cv_.notify_all();
  }
  void WaitFinished(int64_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= n; });
  }

 private:
  const int32_t cap_;
  std::mutex mu_;
  std::condition_variable cv_;
  int32_t in_flight_ = 0;
  int64_t finished_ = 0;
};

// One streamed Generate call; deletes itself when done. Only its own callbacks touch `record`,
// and gRPC runs a reactor's callbacks one at a time.
class StreamCall final : public grpc::ClientReadReactor<pb::GenerateResponse> {
 public:
  StreamCall(pb::Specula::Stub* stub, const pb::GenerateRequest* request, double timeout_seconds,
             RequestRecord* record, Slots* slots)
      : record_(record), slots_(slots) {
    if (timeout_seconds > 0) ctx_.set_deadline(DeadlineIn(timeout_seconds));
    stub->async()->Generate(&ctx_, request, this);
  }

  void Start() {
    start_ = Clock::now();
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const double t = Seconds(start_, Clock::now());
    if (response_.has_usage()) {
      record_->cached_prompt_tokens =
          static_cast<int32_t>(response_.usage().cached_prompt_tokens());
    }
    if (response_.token_ids_size() > 0) {
      record_->messages.push_back({t, response_.token_ids_size()});
    } else {
      ++record_->empty_messages;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    record_->e2e_seconds = Seconds(start_, Clock::now());
    record_->ok = status.ok();
    record_->status_code = static_cast<int32_t>(status.error_code());
    record_->error = status.error_message();
    Slots* slots = slots_;
    delete this;
    slots->Release();
  }

 private:
  grpc::ClientContext ctx_;
  pb::GenerateResponse response_;
  Clock::time_point start_;
  RequestRecord* const record_;
  Slots* const slots_;
};

}  // namespace

absl::StatusOr<pb::ModelInfo> FetchModelInfo(const std::shared_ptr<grpc::Channel>& channel,
                                             double timeout_seconds) {
  if (!channel->WaitForConnected(DeadlineIn(timeout_seconds))) {
    return absl::UnavailableError(
        absl::StrCat("could not connect within ", timeout_seconds, " s (is the server up?)"));
  }
  auto stub = pb::Specula::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout_seconds));
  pb::ModelInfo info;
  const grpc::Status s = stub->GetModelInfo(&ctx, pb::GetModelInfoRequest(), &info);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("GetModelInfo: ", s.error_message()));
  }
  return info;
}

LoadResult RunLoad(pb::Specula::Stub* stub, const LoadPlan& plan) {
  const size_t n = plan.prompts.size();
  // Built up front so that building them costs the measured run nothing.
  std::vector<pb::GenerateRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    pb::GenerateRequest& r = requests[i];
    r.set_request_id(absl::StrCat("bench-", i));
    r.mutable_prompt_token_ids()->mutable_ids()->Add(plan.prompts[i].begin(),
                                                     plan.prompts[i].end());
    r.mutable_sampling()->set_temperature(0);
    r.mutable_stopping()->set_max_tokens(plan.output_len);
    r.mutable_stopping()->set_ignore_eos(true);
    if (!plan.session_ids.empty()) r.set_session_id(plan.session_ids[i]);
  }
  LoadResult result;
  result.records.resize(n);
  for (size_t i = 0; i < n; ++i) {
    result.records[i].prompt_tokens = static_cast<int32_t>(plan.prompts[i].size());
    result.records[i].messages.reserve(plan.output_len);
  }

  Slots slots(plan.max_concurrency);
  const double cpu0 = ProcessCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    if (!plan.arrival_offsets.empty()) {
      std::this_thread::sleep_until(t0 +
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(plan.arrival_offsets[i])));
    }
    slots.Acquire();
    result.records[i].start_seconds = Seconds(t0, Clock::now());
    auto* call =
        new StreamCall(stub, &requests[i], plan.timeout_seconds, &result.records[i], &slots);
    call->Start();
  }
  slots.WaitFinished(static_cast<int64_t>(n));
  result.duration_seconds = Seconds(t0, Clock::now());
  result.client_cpu_seconds = ProcessCpuSeconds() - cpu0;
  return result;
}

}  // namespace specula
