// fused_moe_sm90_bf16: the CUDA backend's default unquantized fused_moe kernel. It runs one of the
// two strategies (fused_moe_sm90_small_m for decode, fused_moe_sm90_grouped for prefill) as the
// pure heuristic choose_moe_strategy() (fused_moe_heuristic.h) says, and falls back to the other
// one when the preferred kernel refuses the problem. Both strategies stay registered under their
// own names (lower priority) so tests, benchmarks and MOEKIT_FORCE_KERNEL can pick either.
// Deterministic by construction (both strategies are). Host-only C++: it only calls the strategy
// entry points. Test: tests/test_fused_moe_heuristic.cpp (heuristic), check_fused_moe (kernel).
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "cuda/cuda_kernels.h"
#include "moekit/core/config.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

struct Strategy {
  Status (*supports)(const FusedMoeParams&);
  size_t (*workspace)(const FusedMoeParams&);
  Status (*run)(const FusedMoeParams&, const RunContext&);
  const char* name;
};

constexpr Strategy kSmallM = {fused_moe_small_m_supports, fused_moe_small_m_workspace_bytes,
                              fused_moe_small_m_run, "fused_moe_sm90_small_m"};
constexpr Strategy kGrouped = {fused_moe_sm90_grouped_supports, fused_moe_sm90_grouped_workspace_bytes,
                               fused_moe_sm90_grouped_run, "fused_moe_sm90_grouped"};

// The strategy to run: the heuristic's choice if it accepts p, else the other one if it does.
// Returns nullptr (with *why) when neither accepts.
const Strategy* pick(const FusedMoeParams& p, std::string* why) {
  const MoeDims d = moe_dims(p);
  const MoeStrategyChoice c = choose_moe_strategy(d.T, d.k, d.E);
  const Strategy* first = c.strategy == MoeStrategy::small_m ? &kSmallM : &kGrouped;
  const Strategy* second = first == &kSmallM ? &kGrouped : &kSmallM;
  const Status s1 = first->supports(p);
  if (s1.ok()) {
    *why = c.reason;
    return first;
  }
  const Status s2 = second->supports(p);
  if (s2.ok()) {
    *why = std::string("preferred ") + first->name + " refuses (" + s1.message() + ")";
    return second;
  }
  *why = std::string(kSmallM.name) + ": " + (first == &kSmallM ? s1 : s2).message() + "; " + kGrouped.name +
         ": " + (first == &kGrouped ? s1 : s2).message();
  return nullptr;
}

Status supports(const FusedMoeParams& p) {
  std::string why;
  if (pick(p, &why) == nullptr) return Unsupported("neither strategy accepts: ", why);
  return Status::Ok();
}

size_t workspace_bytes(const FusedMoeParams& p) {
  std::string why;
  const Strategy* s = pick(p, &why);
  return s ? s->workspace(p) : 0;
}

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  std::string why;
  const Strategy* s = pick(p, &why);
  if (s == nullptr) return Unsupported("neither strategy accepts: ", why);
  if (config().print_dispatch) {
    static std::mutex mu;
    static std::set<std::string> seen;
    const MoeDims d = moe_dims(p);
    const std::string key = std::to_string(d.T) + "/" + std::to_string(d.E) + "/" + std::to_string(d.k) + "/" +
                            std::to_string(d.H) + "/" + std::to_string(d.I) + "/" + s->name;
    std::lock_guard<std::mutex> lock(mu);
    if (seen.insert(key).second) {
      std::fprintf(stderr, "moekit dispatch: fused_moe_sm90_bf16 [T=%lld E=%lld k=%lld] -> %s (%s)\n",
                   (long long)d.T, (long long)d.E, (long long)d.k, s->name, why.c_str());
    }
  }
  return s->run(p, ctx);
}

}  // namespace

void register_fused_moe_sm90_bf16(Registry& r) {
  r.add({"fused_moe_sm90_bf16", OpKind::fused_moe, MoeVariant::unquantized, Backend::cuda,
         "x bf16|f16, w same, f32 accumulate; small_m or grouped GEMM by choose_moe_strategy()", 110,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run>});
}

}  // namespace moekit::cuda
