// Device timing by CUDA-graph replay (declarations without CUDA types; implemented in
// cuda_timing.cu). The CUDA backend registers time_graph as DeviceOps::time_graph (registry.h), so
// `moekit bench` reaches it without device headers; the cuBLAS baseline (moe_baseline_cublas.cu)
// calls it directly. Method: docs/cli.md, "How CUDA rows are measured".
#pragma once

#include <functional>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/registry.h"

namespace moekit::cuda {

// See DeviceOps::time_graph in moekit/registry.h for the contract.
Status time_graph(const std::function<Status(void* stream, int set)>& launch, int sets, int warmup, int iters,
                  L2Flush flush, const char* what, std::vector<double>* us);

// Median of the samples (the upper median for an even count); NAN when empty.
double median_of(std::vector<double> v);

}  // namespace moekit::cuda
