// Which fused_moe strategy a device backend runs for a problem: a pure function of the shape and
// the device, unit-tested in tests/test_fused_moe_heuristic.cpp and printed under
// MOEKIT_PRINT_DISPATCH=1 by the auto kernel (fused_moe_sm90_bf16).
//
// The two strategies of the CUDA backend:
//   small_m       decode: stream each touched expert's weights once over all SMs, CUDA-core dots
//                 against the few rows routed to it (memory-bound; fused_moe_sm90_small_m).
//   grouped_gemm  prefill: rows sorted by expert, tensor-core GEMMs on M tiles
//                 (compute-bound; fused_moe_sm90_grouped).
// Header-only so host code, tests and .cu files share one definition.
#pragma once

#include <cstdint>

namespace moekit {

enum class MoeStrategy : uint8_t { small_m, grouped_gemm };

inline const char* moe_strategy_name(MoeStrategy s) {
  return s == MoeStrategy::small_m ? "small_m" : "grouped_gemm";
}

struct MoeStrategyChoice {
  MoeStrategy strategy;
  double rows_per_expert;  // average (token, slot) rows per touched expert
  const char* reason;
};

// NOTE: the threshold. A dot of one weight element (2 bytes) with m rows costs 2m flop, so the
// small_m kernel runs at m flop per weight byte. Its CUDA-core FMA rate on an H200 (~60 TFLOP/s
// fp32) over 4.3 TB/s gives a balance of ~14 flop/byte: beyond ~8-12 rows per expert it stops being
// memory-bound while the tensor-core GEMM (790 TFLOP/s, balance ~184) is still far from its own
// limit. 8 keeps the CUDA-core kernel at <= 60% of its FMA rate, where it still streams at full
// bandwidth. Rows per touched expert: T*k spread over min(E, T*k) experts (uniform routing).
constexpr double kSmallMMaxRowsPerExpert = 8.0;

inline MoeStrategyChoice choose_moe_strategy(int64_t T, int64_t k, int64_t E) {
  const int64_t entries = T * k;
  const int64_t touched = entries < E ? entries : E;
  const double rows = touched > 0 ? double(entries) / double(touched) : 0.0;
  if (rows <= kSmallMMaxRowsPerExpert) {
    return {MoeStrategy::small_m, rows, "<= 8 rows per touched expert: memory-bound, stream weights once"};
  }
  return {MoeStrategy::grouped_gemm, rows, "> 8 rows per touched expert: tensor-core grouped GEMM"};
}

}  // namespace moekit
