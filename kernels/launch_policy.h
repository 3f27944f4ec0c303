// How kernels are launched, process-wide (model.dependent_launches): whether the kernels that can
// be programmatic dependent launches (kernels/dependent_launch.cuh) are, or are launched the
// ordinary way. Results are the same either way; the switch exists to measure the difference in
// one run and to turn the feature off should a driver mishandle it. The CUDA backend sets it when
// it is created; it applies to every launch after that. SPECULA_DEPENDENT_LAUNCHES=0 in the
// environment turns it off whatever the backend says: the test binaries, which build backends of
// their own, can then be rerun with ordinary launches to tell a launch-order fault from another.
#pragma once

namespace specula::kernels {

void SetDependentLaunches(bool enabled);
bool DependentLaunches();

}  // namespace specula::kernels
