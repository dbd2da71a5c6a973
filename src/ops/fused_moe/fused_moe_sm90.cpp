// The CUDA backend's fused_moe rows and the one place that decides what they launch. A call's recipe
// comes from its variant (bf16 / f16 weights, fp8 per-tensor / per-row, fp8 128 x 128 blocks), its
// config from RunOptions::config or MOEKIT_FUSED_MOE_CONFIG (FusedMoeParams::config) or else from the
// rules (select_sm90_config over the problem and the device's facts); then the recipe's small_m or
// grouped GEMM kernels run that config.
//   fused_moe_sm90_bf16, fused_moe_sm90_fp8_row (router weight on the output or the input),
//   fused_moe_sm90_fp8_block: the default rows (priority 110), either strategy;
//   fused_moe_sm90_small_m, fused_moe_sm90_grouped: one strategy each, every variant (priority 100;
//   never picked by default: the default row of the variant accepts whatever they accept).
// Names and rules: docs/fused_moe_configs.md; design: docs/design/fused_moe_sm90.md.
// Tests: tests/test_fused_moe_sm90_*.cpp, check_fused_moe (--config all runs every legal config).
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda/cuda_kernels.h"
#include "cuda/device_facts.h"
#include "moekit/core/config.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "ops/fused_moe/fused_moe_sm90_decode.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

// The strategies a row may run.
enum class Only : uint8_t { any, small_m, grouped };

// The variants a row serves (a bit each, variant_bit).
constexpr uint8_t kFp8RowBits = variant_bit(MoeVariant::fp8_row) | variant_bit(MoeVariant::fp8_row_tkw1);
constexpr uint8_t kAllBits = variant_bit(MoeVariant::unquantized) | kFp8RowBits | variant_bit(MoeVariant::fp8_block);

// One recipe's kernels: small_m (decode), the grouped GEMMs (prefill, any config of theirs) and
// the one-launch decode (small_m/persistent; null where the recipe has none).
struct RecipeKernels {
  Status (*small_m_supports)(const FusedMoeParams&);
  size_t (*small_m_workspace)(const FusedMoeParams&);
  Status (*small_m_run)(const FusedMoeParams&, const RunContext&);
  Status (*grouped_supports)(const FusedMoeParams&);
  size_t (*grouped_workspace)(const FusedMoeParams&, const Sm90Config&);
  Status (*grouped_run)(const FusedMoeParams&, const Sm90Config&, const RunContext&);
  Status (*persistent_supports)(const FusedMoeParams&) = nullptr;
  size_t (*persistent_workspace)(const FusedMoeParams&) = nullptr;
  Status (*persistent_run)(const FusedMoeParams&, const RunContext&) = nullptr;
};

constexpr RecipeKernels kBf16{fused_moe_small_m_supports,
                              fused_moe_small_m_workspace_bytes,
                              fused_moe_small_m_run,
                              fused_moe_sm90_grouped_supports,
                              fused_moe_sm90_grouped_config_workspace_bytes,
                              fused_moe_sm90_grouped_config_run};
constexpr RecipeKernels kFp8Row{fused_moe_small_m_fp8_supports,
                                fused_moe_small_m_fp8_workspace_bytes,
                                fused_moe_small_m_fp8_run,
                                fused_moe_sm90_grouped_fp8_supports,
                                fused_moe_sm90_grouped_fp8_config_workspace_bytes,
                                fused_moe_sm90_grouped_fp8_config_run};
constexpr RecipeKernels kFp8Block{fused_moe_small_m_fp8_block_supports,
                                  fused_moe_small_m_fp8_workspace_bytes,
                                  fused_moe_small_m_fp8_block_run,
                                  fused_moe_sm90_grouped_fp8_block_supports,
                                  fused_moe_sm90_grouped_fp8_block_config_workspace_bytes,
                                  fused_moe_sm90_grouped_fp8_block_config_run,
                                  fused_moe_sm90_decode_supports,
                                  fused_moe_sm90_decode_workspace_bytes,
                                  fused_moe_sm90_decode_run};

const RecipeKernels& kernels_of(Sm90Recipe r) {
  return r == Sm90Recipe::fp8_block ? kFp8Block : r == Sm90Recipe::fp8_row ? kFp8Row : kBf16;
}

Sm90Problem problem_of(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  Sm90Problem q;
  q.recipe = sm90_recipe_of(fused_moe_variant(p));
  q.T = d.T, q.k = d.k, q.E = d.E, q.Eg = d.Eg, q.H = d.H, q.I = d.I;
  q.g1u1 = d.g1u1;
  return q;
}

const char* strategy_name(Sm90Strategy s) { return s == Sm90Strategy::small_m ? "small_m" : "grouped"; }

Status strategy_supports(const RecipeKernels& k, Sm90Strategy s, const FusedMoeParams& p) {
  return s == Sm90Strategy::small_m ? k.small_m_supports(p) : k.grouped_supports(p);
}
bool persistent(const Sm90Config& c) { return c.mainloop == Sm90Mainloop::persistent; }
// Whether the kernels of config c take p's operands.
Status config_supports(const RecipeKernels& k, const Sm90Config& c, const FusedMoeParams& p) {
  if (!persistent(c)) return strategy_supports(k, c.strategy, p);
  if (k.persistent_supports == nullptr) return Unsupported("small_m/persistent is not built for this recipe");
  return k.persistent_supports(p);
}

// The config a row running `only` launches for p, and why: the explicit config (checked: it must
// parse, be of the row's strategy, take p's shape and its kernels must take p's operands), else the
// rules' choice, else (rows running either strategy) the other strategy when the preferred one's
// kernels refuse p.
struct Plan {
  Sm90Config c;
  std::string why;
};
Status plan(const FusedMoeParams& p, Only only, Plan* out) {
  const Sm90Problem q = problem_of(p);
  const RecipeKernels& k = kernels_of(q.recipe);
  const DeviceFacts& dev = current_device_facts_or_zero();
  if (p.config != nullptr && *p.config) {
    Sm90ConfigRequest req;
    std::string why;
    if (!parse_sm90_config(p.config, q.recipe, &req, &why)) return InvalidArgument(why);
    if (only != Only::any && (req.c.strategy == Sm90Strategy::small_m) != (only == Only::small_m)) {
      return Unsupported("config '", p.config, "' is not a ", only == Only::small_m ? "small_m" : "grouped",
                         " config");
    }
    const Status s = config_supports(k, req.c, p);
    if (!s.ok()) return Unsupported("config '", p.config, "': ", s.message());
    if (!resolve_sm90_config(q, dev, req, &out->c, &why)) return Unsupported(why);
    out->why = std::string("config '") + p.config + "'";
    return Status::Ok();
  }
  const Sm90Config preferred = only == Only::small_m   ? sm90_small_m_config(q.recipe)
                               : only == Only::grouped ? select_sm90_grouped_config(q, dev)
                                                       : select_sm90_config(q, dev);
  const Status s1 = strategy_supports(k, preferred.strategy, p);
  if (s1.ok()) {
    out->c = preferred;
    out->why = "rules";
    return Status::Ok();
  }
  if (only != Only::any) return s1;
  const Sm90Config other = preferred.strategy == Sm90Strategy::small_m ? select_sm90_grouped_config(q, dev)
                                                                       : sm90_small_m_config(q.recipe);
  const Status s2 = strategy_supports(k, other.strategy, p);
  if (s2.ok()) {
    out->c = other;
    out->why = std::string("preferred ") + strategy_name(preferred.strategy) + " refuses (" + s1.message() + ")";
    return Status::Ok();
  }
  const Status& sm = preferred.strategy == Sm90Strategy::small_m ? s1 : s2;
  const Status& gr = preferred.strategy == Sm90Strategy::small_m ? s2 : s1;
  return Unsupported("neither strategy accepts: small_m: ", sm.message(), "; grouped: ", gr.message());
}

// plan() for a row serving the variants kBits (a direct supports() call may pass any variant).
template <Only kOnly, uint8_t kBits>
Status row_plan(const FusedMoeParams& p, Plan* out) {
  const MoeVariant v = fused_moe_variant(p);
  if ((kBits & variant_bit(v)) == 0) return Unsupported("this kernel does not compute variant ", variant_name(v));
  return plan(p, kOnly, out);
}

template <Only kOnly, uint8_t kBits>
Status supports(const FusedMoeParams& p) {
  Plan pl;
  return row_plan<kOnly, kBits>(p, &pl);
}

template <Only kOnly, uint8_t kBits>
size_t workspace(const FusedMoeParams& p) {
  Plan pl;
  if (!row_plan<kOnly, kBits>(p, &pl).ok()) return 0;
  const RecipeKernels& k = kernels_of(pl.c.recipe);
  if (persistent(pl.c)) return k.persistent_workspace(p);
  return pl.c.strategy == Sm90Strategy::small_m ? k.small_m_workspace(p) : k.grouped_workspace(p, pl.c);
}

void print_plan(const char* self, const FusedMoeParams& p, const Plan& pl) {
  static std::mutex mu;
  static std::set<std::string> seen;
  const MoeDims d = moe_dims(p);
  const std::string name = sm90_config_name(pl.c);
  const std::string key = std::string(self) + "/" + std::to_string(d.T) + "/" + std::to_string(d.E) + "/" +
                          std::to_string(d.k) + "/" + std::to_string(d.H) + "/" + std::to_string(d.I) + "/" + name;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(key).second) {
    std::fprintf(stderr, "moekit dispatch: %s [T=%lld E=%lld k=%lld H=%lld I=%lld] -> %s (%s)\n", self,
                 (long long)d.T, (long long)d.E, (long long)d.k, (long long)d.H, (long long)d.I, name.c_str(),
                 pl.why.c_str());
  }
}

template <Only kOnly, uint8_t kBits>
Status run_as(const char* self, const FusedMoeParams& p, const RunContext& ctx) {
  Plan pl;
  MOEKIT_RETURN_IF_ERROR((row_plan<kOnly, kBits>(p, &pl)));
  if (config().print_dispatch) print_plan(self, p, pl);
  const RecipeKernels& k = kernels_of(pl.c.recipe);
  if (persistent(pl.c)) return k.persistent_run(p, ctx);
  return pl.c.strategy == Sm90Strategy::small_m ? k.small_m_run(p, ctx) : k.grouped_run(p, pl.c, ctx);
}

// The configs a row can run for p whose kernels take p's operands, the one it would run first.
template <Only kOnly, uint8_t kBits>
std::vector<std::string> configs(const void* params) {
  const auto& p = *static_cast<const FusedMoeParams*>(params);
  std::vector<std::string> out;
  Plan pl;
  if (!row_plan<kOnly, kBits>(p, &pl).ok()) return out;
  out.push_back(sm90_config_name(pl.c));
  const Sm90Problem q = problem_of(p);
  const RecipeKernels& k = kernels_of(q.recipe);
  const bool small_ok = kOnly != Only::grouped && k.small_m_supports(p).ok();
  const bool grouped_ok = kOnly != Only::small_m && k.grouped_supports(p).ok();
  for (const Sm90Config& c : legal_sm90_configs(q, current_device_facts_or_zero())) {
    const bool ok = persistent(c) ? kOnly != Only::grouped && config_supports(k, c, p).ok()
                    : c.strategy == Sm90Strategy::small_m ? small_ok
                                                          : grouped_ok;
    if (ok && !(c == pl.c)) out.push_back(sm90_config_name(c));
  }
  return out;
}

constexpr uint8_t kBf16Bits = variant_bit(MoeVariant::unquantized), kBlockBits = variant_bit(MoeVariant::fp8_block);

Status run_bf16(const FusedMoeParams& p, const RunContext& ctx) {
  return run_as<Only::any, kBf16Bits>("fused_moe_sm90_bf16", p, ctx);
}
Status run_fp8_row(const FusedMoeParams& p, const RunContext& ctx) {
  return run_as<Only::any, kFp8RowBits>("fused_moe_sm90_fp8_row", p, ctx);
}
Status run_fp8_block(const FusedMoeParams& p, const RunContext& ctx) {
  return run_as<Only::any, kBlockBits>("fused_moe_sm90_fp8_block", p, ctx);
}
Status run_small_m(const FusedMoeParams& p, const RunContext& ctx) {
  return run_as<Only::small_m, kAllBits>("fused_moe_sm90_small_m", p, ctx);
}
Status run_grouped(const FusedMoeParams& p, const RunContext& ctx) {
  return run_as<Only::grouped, kAllBits>("fused_moe_sm90_grouped", p, ctx);
}

}  // namespace

void register_fused_moe_sm90(Registry& r) {
  using P = FusedMoeParams;
  constexpr Only any = Only::any, sm = Only::small_m, gr = Only::grouped;
  const uint8_t fp8_all = kAllBits & ~kBf16Bits;
  r.add({"fused_moe_sm90_bf16", OpKind::fused_moe, MoeVariant::unquantized, Backend::cuda,
         "x bf16|f16, w same, f32 accumulate; small_m or grouped GEMM, config by select_sm90_config", 110,
         erase_supports<P, supports<any, kBf16Bits>>, erase_workspace<P, workspace<any, kBf16Bits>>,
         erase_run<P, run_bf16>, 0, configs<any, kBf16Bits>});
  r.add({"fused_moe_sm90_fp8_row", OpKind::fused_moe, MoeVariant::fp8_row, Backend::cuda,
         "x bf16|f16, w e4m3fn per-tensor|per-row scales, x / a quantized per row (e4m3fn), router weight on the "
         "output or the input; small_m or grouped GEMM, config by select_sm90_config",
         110, erase_supports<P, supports<any, kFp8RowBits>>, erase_workspace<P, workspace<any, kFp8RowBits>>,
         erase_run<P, run_fp8_row>, variant_bit(MoeVariant::fp8_row_tkw1), configs<any, kFp8RowBits>});
  r.add({"fused_moe_sm90_fp8_block", OpKind::fused_moe, MoeVariant::fp8_block, Backend::cuda,
         "x bf16|f16, w e4m3fn 128x128 block scales, x / a quantized per 1x128 group; small_m or grouped GEMM, "
         "config by select_sm90_config",
         110, erase_supports<P, supports<any, kBlockBits>>, erase_workspace<P, workspace<any, kBlockBits>>,
         erase_run<P, run_fp8_block>, 0, configs<any, kBlockBits>});
  r.add({"fused_moe_sm90_small_m", OpKind::fused_moe, MoeVariant::unquantized, Backend::cuda,
         "every variant: CUDA-core f32 dots, each touched expert's weights streamed once (decode-sized T)", 100,
         erase_supports<P, supports<sm, kAllBits>>, erase_workspace<P, workspace<sm, kAllBits>>,
         erase_run<P, run_small_m>, fp8_all, configs<sm, kAllBits>});
  r.add({"fused_moe_sm90_grouped", OpKind::fused_moe, MoeVariant::unquantized, Backend::cuda,
         "every variant: grouped GEMMs on tensor cores (HGMMA / QGMMA, mma.sync), config by the rules or "
         "RunOptions::config",
         100, erase_supports<P, supports<gr, kAllBits>>, erase_workspace<P, workspace<gr, kAllBits>>,
         erase_run<P, run_grouped>, fp8_all, configs<gr, kAllBits>});
}

}  // namespace moekit::cuda
