// One description of what a CUDA fused_moe launch runs, in place of a registry row per tile shape:
// Sm90Config (strategy, tile, mainloop, stages, schedules, gemm2 K ranges), its name, the configs
// compiled for a recipe that take a problem (legal_configs), and the rules that pick one
// (select_config) from the problem and the device's facts. Host-only C++: the CUDA rows
// (fused_moe_sm90.cpp) run what these say; tests/test_fused_moe_sm90_config.cpp checks that
// select_config reproduces the recorded choices (tests/data/fused_moe_sm90_choices.csv) and that
// names parse back. docs/fused_moe_configs.md (names), docs/design/fused_moe_sm90.md (3.1-3.5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_facts.h"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_tiles.h"

namespace moekit {

enum class Sm90Recipe : uint8_t { bf16, fp8_row, fp8_block };  // bf16: bf16 or f16 operands
enum class Sm90Strategy : uint8_t { small_m, grouped };
// mma: cp.async + mma.sync; ws: TMA + wgmma, warp-specialised; ring: the fp8 TMA ring with f32
// promotion per K slice; none: small_m (CUDA-core dots); persistent: small_m as one cooperative
// launch (fused_moe_sm90_decode.h; fp8_block, T <= 8; named "small_m/persistent", never picked by
// the rules).
enum class Sm90Mainloop : uint8_t { none, mma, ws, ring, persistent };
// grid: one CTA per tile; static_order: CTA b takes items b + i * grid; dynamic: a work counter.
enum class Sm90Schedule : uint8_t { grid, static_order, dynamic };

struct Sm90Config {
  Sm90Recipe recipe = Sm90Recipe::bf16;
  Sm90Strategy strategy = Sm90Strategy::small_m;
  int tile_m = 0, tile_n = 0;  // grouped: M x N tile rows x columns (0 for small_m)
  int consumer_wgs = 0;        // ws / ring: consumer warpgroups (3 only for 192 x 256); mma: 0
  Sm90Mainloop mainloop = Sm90Mainloop::none;
  int stages[2] = {0, 0};      // gemm1, gemm2 pipeline depth (0: small_m)
  Sm90Schedule sched[2] = {Sm90Schedule::grid, Sm90Schedule::grid};
  int gemm2_splits = 1;        // K ranges of gemm2, each an f32 partial added in a fixed order

  bool operator==(const Sm90Config& o) const {
    return recipe == o.recipe && strategy == o.strategy && tile_m == o.tile_m && tile_n == o.tile_n &&
           consumer_wgs == o.consumer_wgs && mainloop == o.mainloop && stages[0] == o.stages[0] &&
           stages[1] == o.stages[1] && sched[0] == o.sched[0] && sched[1] == o.sched[1] &&
           gemm2_splits == o.gemm2_splits;
  }
};

// The problem as the rules see it (built from FusedMoeParams by the launch code once wired).
struct Sm90Problem {
  Sm90Recipe recipe = Sm90Recipe::bf16;
  int64_t T = 0, k = 0, E = 0, Eg = 0, H = 0, I = 0;  // Eg: global experts (E without EP)
  bool g1u1 = true;                                  // w1 holds gate and up rows
  int64_t tk() const { return T * k; }
};

// The recipe of a fused_moe variant (the router weight on the input is a flag of fp8_row), its
// name ("bf16", "fp8_row", "fp8_block": MOEKIT_FUSED_MOE_CONFIG's prefixes), and its small_m config.
Sm90Recipe sm90_recipe_of(MoeVariant v);
const char* sm90_recipe_name(Sm90Recipe r);
Sm90Config sm90_small_m_config(Sm90Recipe r);
// The one-launch decode config (small_m/persistent) and why it cannot run p ("" when it can, as far
// as the shape says: fp8_block, 1 <= T <= 8, T k <= 256, H and I multiples of 128).
Sm90Config sm90_persistent_config(Sm90Recipe r);
std::string sm90_persistent_refusal(const Sm90Problem& p);

// "small_m", "small_m/persistent" or "grouped/{M}x{N}.{mma|ws|ring}{stages}[.{stages2}]" then options: "+dynamic",
// "+static" (both gemms), "+dynamic1" / "+dynamic2" (one gemm dynamic, the other static; bf16 ws
// only: the other mainloops have one schedule), "+k{n}" (gemm2 K ranges; ws and 64 x 256 ring only).
// The recipe is not in the name. Names written here are complete (every choice spelled out).
std::string sm90_config_name(const Sm90Config& c);

// A parsed name: the fields it gives; the others follow the rules (resolve_sm90_config).
struct Sm90ConfigRequest {
  Sm90Config c;
  bool stages = false, sched = false, splits = false;  // given in the name
};
// The request a name denotes for `recipe`; false (with *why) for a malformed name.
bool parse_sm90_config(const std::string& name, Sm90Recipe recipe, Sm90ConfigRequest* out, std::string* why);
// As above for a complete name (fields not given keep the family's defaults).
bool parse_sm90_config(const std::string& name, Sm90Recipe recipe, Sm90Config* out, std::string* why);
// The request completed by the rules for p on `dev`; false (with *why) when the config cannot run p:
// its tile does not take p's shape, or a given stage count, schedule or K range count is not one
// compiled for the tile (design 3.3).
bool resolve_sm90_config(const Sm90Problem& p, const DeviceFacts& dev, const Sm90ConfigRequest& req, Sm90Config* out,
                         std::string* why);

// Every config compiled for p's recipe whose tile takes p's shape, with each stage count, schedule
// and K range count the tile compiles (the sweep of `moekit bench --config all`); operand checks
// such as dtypes, scales and alignment stay with the kernels' supports().
std::vector<Sm90Config> legal_sm90_configs(const Sm90Problem& p, const DeviceFacts& dev);
// The rules' choice (design 3.5, S1-S9) for p on `dev`.
Sm90Config select_sm90_config(const Sm90Problem& p, const DeviceFacts& dev);
// The grouped config the rules pick for p (S4-S9), whatever the strategy rule says.
Sm90Config select_sm90_grouped_config(const Sm90Problem& p, const DeviceFacts& dev);

}  // namespace moekit
