// The CPU backend's streams and events (engine/backend/stream.h): each ordering rule has a test
// that fails if the rule is broken. Copy streams are held at a CopyGate, so "not yet" is a state
// the test controls instead of a race it hopes to win.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_stream.h"
#include "tests/engine/kv/gated_copy_backend.h"

namespace specula {
namespace {

using ::specula::testing::CopyGate;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr size_t kPage = 64;

struct Pages {
  std::vector<char> a = std::vector<char>(kPage, 'a');
  std::vector<char> b = std::vector<char>(kPage, 'b');
  std::vector<char> c = std::vector<char>(kPage, 'c');
};

std::vector<PageCopy> One(std::vector<char>& dst, const std::vector<char>& src) {
  return {PageCopy{dst.data(), src.data()}};
}

TEST(CpuStreamTest, AnEventIsDoneOnlyOnceTheCopiesBeforeItLanded) {
  CopyGate gate;
  gate.Close(seconds(30));
  CpuCopyStream stream(nullptr, [&] { gate.Enter(); });
  Pages p;
  stream.CopyPages(One(p.b, p.a), kPage);  // returns while the copy is held
  const std::shared_ptr<Event> landed = stream.Record();
  ASSERT_TRUE(gate.WaitForHeld(1, seconds(30)));
  EXPECT_FALSE(landed->Done());
  EXPECT_EQ(p.b[0], 'b');
  gate.Open();
  landed->Synchronize();
  EXPECT_TRUE(landed->Done());
  EXPECT_EQ(p.b, p.a);
}

TEST(CpuStreamTest, OneStreamRunsItsWorkInOrder) {
  // The second copy reads what the first writes; the first is held a while.
  CopyGate gate;
  gate.Close(milliseconds(200));
  int copies = 0;
  CpuCopyStream stream(nullptr, [&] {
    if (copies++ == 0) gate.Enter();
  });
  Pages p;
  stream.CopyPages(One(p.b, p.a), kPage);
  stream.CopyPages(One(p.c, p.b), kPage);
  stream.Synchronize();
  EXPECT_EQ(p.c, p.a);
}

TEST(CpuStreamTest, AStreamWaitingOnAnEventRunsLaterWorkAfterIt) {
  // Stream 1 brings a into b, held for 200 ms; stream 2 then copies b into c. Without the wait,
  // stream 2 would copy the old b at once.
  CopyGate gate;
  gate.Close(milliseconds(200));
  CpuCopyStream first(nullptr, [&] { gate.Enter(); });
  CpuCopyStream second;
  Pages p;
  first.CopyPages(One(p.b, p.a), kPage);
  second.Wait(first.Record());
  second.CopyPages(One(p.c, p.b), kPage);
  second.Synchronize();
  EXPECT_GE(gate.held(), 1);
  EXPECT_EQ(p.c, p.a);
}

TEST(CpuStreamTest, TheComputeStreamWaitingOnAnEventDoesNotRunAheadOfIt) {
  // The engine thread executes compute work, so Wait holds it until the copy landed: what it
  // reads next is the copied page.
  CopyGate gate;
  gate.Close(milliseconds(200));
  CpuCopyStream copy(nullptr, [&] { gate.Enter(); });
  CpuBackend backend(1);
  Pages p;
  copy.CopyPages(One(p.b, p.a), kPage);
  backend.compute_stream().Wait(copy.Record());
  backend.compute_stream().CopyPages(One(p.c, p.b), kPage);
  EXPECT_GE(gate.held(), 1);
  EXPECT_EQ(p.c, p.a);
}

// The compute stream's timed events around a wait measure how long it stood still (the decode
// stall the prefetcher reports): at least the copy's hold, and ~0 when the copy has landed.
TEST(CpuStreamTest, TimedEventsMeasureHowLongTheComputeStreamStoodStillForACopy) {
  CopyGate gate;
  gate.Close(milliseconds(200));
  CpuCopyStream copy(nullptr, [&] { gate.Enter(); });
  CpuBackend backend(1);
  Stream& compute = backend.compute_stream();
  Pages p;
  copy.CopyPages(One(p.b, p.a), kPage);
  const std::shared_ptr<Event> landed = copy.Record();
  const std::shared_ptr<Event> before = compute.RecordTimed();
  compute.Wait(landed);
  const std::shared_ptr<Event> after = compute.RecordTimed();
  EXPECT_GE(gate.held(), 1);
  ASSERT_TRUE(after->SecondsSince(*before).has_value());
  // The hold is 200 ms from when the copy thread reached the gate: at most a moment before
  // `before` was recorded (or after it, which makes the wait longer still).
  EXPECT_GE(after->SecondsSince(*before).value(), 0.15);
  EXPECT_LT(after->SecondsSince(*before).value(), 30);

  const std::shared_ptr<Event> again = compute.RecordTimed();
  compute.Wait(landed);  // landed already: no stall
  EXPECT_LT(compute.RecordTimed()->SecondsSince(*again).value(), 0.1);
}

// A copy stream's timed events are stamped when its thread reaches them: unknown until both are.
TEST(CpuStreamTest, ACopyStreamsTimedEventsAreReadOnlyOnceBothAreDone) {
  CopyGate gate;
  gate.Close(seconds(30));
  CpuCopyStream copy(nullptr, [&] { gate.Enter(); });
  Pages p;
  const std::shared_ptr<Event> start = copy.RecordTimed();
  copy.CopyPages(One(p.b, p.a), kPage);
  const std::shared_ptr<Event> end = copy.RecordTimed();
  ASSERT_TRUE(gate.WaitForHeld(1, seconds(30)));
  EXPECT_FALSE(end->SecondsSince(*start).has_value());
  gate.Open();
  end->Synchronize();
  ASSERT_TRUE(end->SecondsSince(*start).has_value());
  EXPECT_GE(*end->SecondsSince(*start), 0);
}

// A duration read from an event of Record would be wrong on the CPU and abort on a GPU (its events
// have no timing): refused on the CPU too, so CPU tests catch it.
TEST(CpuStreamTest, OnlyTimedEventsAreTimed) {
  CpuBackend backend(1);
  Stream& compute = backend.compute_stream();
  const std::shared_ptr<Event> timed = compute.RecordTimed();
  EXPECT_DEATH((void)compute.Record()->SecondsSince(*timed), "two timed");
  EXPECT_DEATH((void)timed->SecondsSince(*compute.Record()), "two timed");
}

// A copy stream's thread runs below its creator's priority (10 nice levels, at most 19), so
// waking it does not preempt the compute threads (engine/cpu/cpu_stream.cc).
TEST(CpuStreamTest, TheCopyThreadRunsBelowItsCreatorsPriority) {
  errno = 0;
  const int creator = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_EQ(errno, 0);
  if (creator >= 19) GTEST_SKIP() << "already at the lowest priority: nothing to lower";
  int copier = creator;
  CpuCopyStream stream(nullptr, [&] { copier = getpriority(PRIO_PROCESS, 0); });
  Pages p;
  stream.CopyPages(One(p.b, p.a), kPage);
  stream.Synchronize();  // orders the hook's write before this read
  EXPECT_EQ(copier, std::min(19, creator + 10));
}

TEST(CpuStreamTest, DestroyingAStreamFinishesWhatWasEnqueued) {
  CopyGate gate;
  gate.Close(milliseconds(100));
  Pages p;
  {
    CpuCopyStream stream(nullptr, [&] { gate.Enter(); });
    stream.CopyPages(One(p.b, p.a), kPage);
  }
  EXPECT_EQ(p.b, p.a);
}

TEST(CpuStreamTest, ABatchedCopyMovesEveryPageOfItsList) {
  CpuBackend backend(1);
  std::unique_ptr<Stream> stream = backend.CreateStream();
  std::vector<char> src(4 * kPage), dst(4 * kPage, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i / kPage + 1);
  // A gather: source pages 3, 0, 2 into destination slots 0, 1, 2; slot 3 stays untouched.
  std::vector<PageCopy> list = {{dst.data(), src.data() + 3 * kPage},
                                {dst.data() + kPage, src.data()},
                                {dst.data() + 2 * kPage, src.data() + 2 * kPage}};
  stream->CopyPages(list, kPage);
  list.clear();  // the stream captured the list at the call
  stream->Synchronize();
  EXPECT_EQ(dst[0], 4);
  EXPECT_EQ(dst[kPage], 1);
  EXPECT_EQ(dst[2 * kPage], 3);
  EXPECT_EQ(dst[3 * kPage], 0);
}

TEST(CpuStreamTest, TheBackendCountsComputeSynchronizationsAndHostReads) {
  CpuBackend backend(1);
  EXPECT_TRUE(backend.compute_stream().Record()->Done());  // compute runs at enqueue
  backend.Synchronize();
  backend.compute_stream().Synchronize();
  float x = 1, y = 0;
  backend.CopyToHost(&y, &x, sizeof(x));
  backend.CopyToDevice(&x, &y, sizeof(x));             // not a read
  EXPECT_EQ(backend.counters().host_syncs.load(), 3);  // a read waits for compute
  EXPECT_EQ(backend.counters().host_reads.load(), 1);
}

TEST(CpuStreamTest, EveryHostWaitCountsAndAStreamsWaitDoesNot) {
  // A host thread blocked on a copy stream or an event is a synchronization like a readback (a
  // sparse step's release waiting for its prefetches would show here); the compute stream
  // waiting on an event is device-side ordering and costs the host nothing on a GPU.
  CpuBackend backend(1);
  std::unique_ptr<Stream> copy = backend.CreateStream();
  std::vector<char> a(kPage, 'a'), b(kPage, 'b');
  copy->CopyPages(One(b, a), kPage);
  backend.compute_stream().Wait(copy->Record());
  EXPECT_EQ(backend.counters().host_syncs.load(), 0);
  copy->Record()->Synchronize();
  EXPECT_EQ(backend.counters().host_syncs.load(), 1);
  copy->Synchronize();
  EXPECT_EQ(backend.counters().host_syncs.load(), 2);
  EXPECT_EQ(backend.counters().host_reads.load(), 0);
}

TEST(CpuStreamTest, RecordReusesEventsNobodyHolds) {
  // Record runs per layer and step: it must not make a new event each time. Each iteration lets
  // go of its event, so a handful serve a thousand records; one kept is never handed out again.
  CpuBackend backend(1);
  std::unique_ptr<Stream> copy = backend.CreateStream();
  const std::shared_ptr<Event> kept = copy->Record();
  kept->Synchronize();
  std::set<const Event*> seen;
  for (int i = 0; i < 1000; ++i) {
    std::shared_ptr<Event> e = copy->Record();
    e->Synchronize();
    EXPECT_NE(e.get(), kept.get());
    seen.insert(e.get());
  }
  EXPECT_LE(seen.size(), 3u);
  EXPECT_TRUE(kept->Done());  // a kept event stays done: nobody re-armed it
}

// Resident set size of this process, from /proc/self/statm.
size_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

TEST(CpuStreamTest, PinnedHostMemoryIsUsableAndCommittedLazily) {
  CpuBackend backend(1);
  const size_t before = ResidentBytes();
  auto memory = backend.AllocatePinnedHost(size_t{1} << 30);  // 1 GiB mapped, not touched
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->bytes(), size_t{1} << 30);
  static_cast<char*>(memory->data())[12345] = 7;
  EXPECT_EQ(static_cast<char*>(memory->data())[12345], 7);
  // The host KV store maps its whole capacity at startup; only pages in use may cost memory.
  EXPECT_LT(ResidentBytes(), before + (size_t{64} << 20));
}

}  // namespace
}  // namespace specula
