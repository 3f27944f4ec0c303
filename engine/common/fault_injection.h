// Fault injection for tests (issue 15): named points in the engine where a test can make the
// next N passes fail or slow down, to check that only the affected requests end, with the
// documented code, and that nothing leaks.
//
// Compiled in only when SPECULA_FAULT_INJECTION is defined, which CMake does for builds with
// tests (SPECULA_BUILD_TESTS, the default); the release image (SPECULA_BUILD_TESTS=OFF) has no
// injection points at all: SPECULA_FAULT(...) is the constant false there.
//
// Thread-safe: faults are armed from the test's thread and hit on the engine's and the copy
// streams' threads.
#pragma once

#include "absl/time/time.h"

namespace specula {

enum class Fault {
  kHostPageAlloc,  // HostKvStore hands out no pages: the request being admitted fails (INTERNAL)
  kEngineStep,     // Generator::Step fails before the forward pass: its running requests fail
  kSlowPageCopy,   // a copy stream sleeps `delay` before each batched copy: pages arrive late
  kStallStep,      // Generator::Step sleeps `delay` first: a hung step, for the watchdog
  kFailPageCopy,   // a copy stream's batched copy fails (nothing copied): its sparse requests fail
  kSlowDevice,     // the CPU backend's readbacks and compute-stream waits sleep `delay`, as
                   // waiting for a GPU still computing would
  kDeviceLost,     // the CPU backend's next readback reports a device fault (Backend::device_fault)
  kEmptyMask,      // an output constraint's next mask allows no token, as when the vocabulary
                   // cannot spell what the grammar needs (the request fails with INTERNAL)
  kSlowMaskPreparation,  // the mask preparer sleeps `delay` before a grammar's walks, as a
                         // large vocabulary's take: its request must wait for them
};
inline constexpr int kFaults = 9;

#ifdef SPECULA_FAULT_INJECTION
inline constexpr bool kFaultInjection = true;
// The next `times` passes through `fault` hit it (each waiting `delay` first, if given).
void ArmFault(Fault fault, int times = 1, absl::Duration delay = absl::ZeroDuration());
// Clears every armed fault.
void DisarmFaults();
// Whether this pass hits `fault` (consuming one of its armed passes); sleeps its delay first
// when it has one (kSlowPageCopy, kStallStep, kSlowDevice, kSlowMaskPreparation).
bool HitFault(Fault fault);
#define SPECULA_FAULT(fault) ::specula::HitFault(fault)
#else
inline constexpr bool kFaultInjection = false;
inline void ArmFault(Fault, int = 1, absl::Duration = absl::ZeroDuration()) {}
inline void DisarmFaults() {}
#define SPECULA_FAULT(fault) false
#endif

}  // namespace specula
