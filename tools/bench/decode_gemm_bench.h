// `specula-bench attention`'s decode GEMM table: the GEMMs of a decode step of a few rows (1: the
// one-row kernel; 2-16: the few-row tensor-core kernel, after x's conversion to bf16), which read
// every weight once and so are bound by memory bandwidth, not arithmetic. For each model shape
// (the projections of Llama-3.2-1B and Llama-3.1-8B) and row count: each projection's copies back
// to back,
// then a layer's chain as the forward pass runs it (norm, qkv; o; norm, gate_up; SwiGLU, down:
// the kernels ahead of each GEMM included, since a GEMM may overlap the end of the kernel ahead of
// it). Each cycles through enough copies of its weights that L2 holds none of them, and is
// recorded once and replayed where the backend records (CUDA graphs, as decode steps run): a
// sample is 10 replays and one synchronization, so the host's launch cost is a small part of it.
// Reports the median time a GEMM (a layer, for the chain) and the weight bytes read per second, to
// set against the card's copy bandwidth.
#pragma once

#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace specula {

// Whether `name` is a model shape of the table: "1b" or "8b".
bool DecodeGemmModelKnown(const std::string& name);

// Prints the table to stdout; returns a process exit code.
int RunDecodeGemmTable(Backend& backend, const std::vector<std::string>& models,
                       const std::vector<int>& row_counts, int repeats);

}  // namespace specula
