// Sm90Config names, the legal configs of a problem and the rules that pick one (fused_moe_sm90_config.h).
// Each rule cites the decision point of docs/design/fused_moe_sm90.md (2.1) it reproduces.
#include "ops/fused_moe/fused_moe_sm90_config.h"

#include <algorithm>
#include <cstdlib>

#include "ops/fused_moe/fused_moe_sm90_decode.h"

namespace moekit {

namespace {

const char* mainloop_name(Sm90Mainloop m) {
  switch (m) {
    case Sm90Mainloop::mma: return "mma";
    case Sm90Mainloop::ws: return "ws";
    case Sm90Mainloop::ring: return "ring";
    case Sm90Mainloop::persistent:
    case Sm90Mainloop::none: break;
  }
  return "";
}

// A grouped config of a tile family with the family's fixed fields (design 3.3); stages, schedules
// and K ranges are filled by the rules.
Sm90Config grouped(Sm90Recipe r, int m, int n, Sm90Mainloop loop) {
  Sm90Config c;
  c.recipe = r;
  c.strategy = Sm90Strategy::grouped;
  c.tile_m = m;
  c.tile_n = n;
  c.mainloop = loop;
  c.consumer_wgs = loop == Sm90Mainloop::mma ? 0 : (m == 192 ? 3 : 2);
  const Sm90Schedule s = loop == Sm90Mainloop::mma    ? Sm90Schedule::grid
                         : loop == Sm90Mainloop::ring ? Sm90Schedule::static_order
                                                      : Sm90Schedule::dynamic;  // fp8 ws (D13)
  c.sched[0] = c.sched[1] = s;
  return c;
}

// The pipeline depth a tile's kernels are compiled with (the block mma tiles: 4, or 5 by D11).
int tile_stages(const Sm90Config& c) {
  if (c.mainloop == Sm90Mainloop::ring) return c.tile_m == 64 ? 5 : (c.tile_n == 128 ? 7 : 4);
  return c.mainloop == Sm90Mainloop::ws && c.tile_m == 192 ? 3 : 4;
}

// The tile's pipeline depth; the block mma tiles' per gemm by D11.
void set_stages(const Sm90Problem& p, const DeviceFacts& dev, Sm90Config* c) {
  if (c->strategy == Sm90Strategy::small_m) return;
  c->stages[0] = c->stages[1] = tile_stages(*c);
  if (c->recipe == Sm90Recipe::fp8_block && c->mainloop == Sm90Mainloop::mma) {
    const Fp8BlockMmaStages st = fp8_block_mma_gemm_stages(cuda::fused_moe_sm90_grouped_tiles_max(p.tk(), p.E, 64),
                                                           p.H, p.I, p.g1u1, false, dev.sm_count);
    c->stages[0] = st.gemm1;
    c->stages[1] = st.gemm2;
  }
}

// Schedules (D12, D13) and gemm2's K ranges (D14, D15).
void set_schedule_and_splits(const Sm90Problem& p, const DeviceFacts& dev, Sm90Config* c) {
  if (c->strategy == Sm90Strategy::small_m) return;
  if (c->recipe == Sm90Recipe::bf16 && c->mainloop == Sm90Mainloop::ws) {
    c->sched[0] = fused_moe_sm90_grouped_ws_dynamic(p.g1u1 ? 2 * p.I : p.I) ? Sm90Schedule::dynamic
                                                                            : Sm90Schedule::static_order;
    c->sched[1] = fused_moe_sm90_grouped_ws_dynamic(p.H) ? Sm90Schedule::dynamic : Sm90Schedule::static_order;
  }
  c->gemm2_splits = 1;
  if (c->mainloop == Sm90Mainloop::ws) {  // D14: K slices of 64 (bf16) or 128 codes (fp8)
    const int64_t slices = p.I / (c->recipe == Sm90Recipe::bf16 ? 64 : 128);
    c->gemm2_splits = cuda::fused_moe_sm90_grouped_gemm2_splits(
        cuda::fused_moe_sm90_grouped_tiles_max(p.tk(), p.E, c->tile_m), (p.H + 255) / 256, slices, dev.sm_count);
  } else if (c->mainloop == Sm90Mainloop::ring && c->tile_m == 64) {  // D15
    c->gemm2_splits = fused_moe_sm90_tma64_gemm2_splits(p.tk(), p.E, p.H / 256, p.I / 128, dev.sm_count);
  }
}

void resolve(const Sm90Problem& p, const DeviceFacts& dev, Sm90Config* c) {
  set_stages(p, dev, c);
  set_schedule_and_splits(p, dev, c);
}

// The grouped tile families compiled for a recipe that take p's shape (design 2.2, 3.3).
std::vector<Sm90Config> grouped_families(const Sm90Problem& p) {
  std::vector<Sm90Config> out;
  const bool tma256 = fp8_tma256_takes(p.H, p.I, p.g1u1);
  switch (p.recipe) {
    case Sm90Recipe::bf16:
      if (p.H % 64 == 0 && p.I % 64 == 0) {
        out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::mma));
        out.push_back(grouped(p.recipe, 128, 256, Sm90Mainloop::ws));
      }
      break;
    case Sm90Recipe::fp8_row:
      if (fp8_row_tma_takes(p.H, p.I)) {
        if (tma256) out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::ring));
        out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::mma));
        out.push_back(grouped(p.recipe, 128, 256, Sm90Mainloop::ws));
        out.push_back(grouped(p.recipe, 192, 256, Sm90Mainloop::ws));
      } else if (p.H % kFp8RowMinMultiple == 0 && p.I % kFp8RowMinMultiple == 0) {
        out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::mma));  // the only tile off the 128 grid
      }
      break;
    case Sm90Recipe::fp8_block:
      if (p.H % 128 == 0 && p.I % 128 == 0) {
        if (tma256) out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::ring));
        if (fp8_block_mma64_fits(p.H, p.I)) out.push_back(grouped(p.recipe, 64, 256, Sm90Mainloop::mma));
        if (tma256) out.push_back(grouped(p.recipe, 128, 256, Sm90Mainloop::ring));
        out.push_back(grouped(p.recipe, 128, 128, Sm90Mainloop::ring));
      }
      break;
  }
  return out;
}

// The grouped tile the rules pick (D5-D9); assumes the shape's families (grouped_families).
Sm90Config pick_grouped(const Sm90Problem& p) {
  const bool tma256 = fp8_tma256_takes(p.H, p.I, p.g1u1);
  switch (p.recipe) {
    case Sm90Recipe::bf16: {  // D5: by tk against the GLOBAL experts
      const int bm = cuda::fused_moe_sm90_grouped_tile_m(p.tk(), p.Eg);
      return grouped(p.recipe, bm, 256, cuda::fused_moe_sm90_grouped_uses_tma(bm) ? Sm90Mainloop::ws
                                                                                  : Sm90Mainloop::mma);
    }
    case Sm90Recipe::fp8_row:  // D6-D8
      if (!fp8_row_tma_takes(p.H, p.I)) return grouped(p.recipe, 64, 256, Sm90Mainloop::mma);
      switch (fp8_row_tiles(p.tk(), p.E, tma256)) {
        case Fp8RowTiles::tma64: return grouped(p.recipe, 64, 256, Sm90Mainloop::ring);
        case Fp8RowTiles::mma64: return grouped(p.recipe, 64, 256, Sm90Mainloop::mma);
        case Fp8RowTiles::m192: return grouped(p.recipe, 192, 256, Sm90Mainloop::ws);
        case Fp8RowTiles::tma128: break;
      }
      return grouped(p.recipe, 128, 256, Sm90Mainloop::ws);
    case Sm90Recipe::fp8_block:  // D9, D10
      switch (fp8_block_tiles(p.tk(), p.E, tma256, fp8_block_mma64_fits(p.H, p.I))) {
        case Fp8BlockTiles::tma64: return grouped(p.recipe, 64, 256, Sm90Mainloop::ring);
        case Fp8BlockTiles::mma64: return grouped(p.recipe, 64, 256, Sm90Mainloop::mma);
        case Fp8BlockTiles::tma128n256: return grouped(p.recipe, 128, 256, Sm90Mainloop::ring);
        case Fp8BlockTiles::tma128: break;
      }
      return grouped(p.recipe, 128, 128, Sm90Mainloop::ring);
  }
  return grouped(p.recipe, 128, 256, Sm90Mainloop::ws);
}

// The most gemm2 K ranges a tile's kernels are run with (the ranges its tests cover): the ws tiles
// 2, the 64 x 256 ring 4, the others 1 (design 3.3).
int max_splits(const Sm90Config& c) {
  if (c.mainloop == Sm90Mainloop::ws) return 2;
  return c.mainloop == Sm90Mainloop::ring && c.tile_m == 64 ? 4 : 1;
}

std::string family_list(const Sm90Problem& p) {
  std::string s;
  for (const Sm90Config& f : grouped_families(p)) {
    s += (s.empty() ? "" : ", ") + std::to_string(f.tile_m) + "x" + std::to_string(f.tile_n) + "." +
         mainloop_name(f.mainloop);
  }
  return s.empty() ? "none" : s;
}

// Why c's tile does not take p (it is not among grouped_families(p)).
std::string tile_refusal(const Sm90Problem& p, const Sm90Config& c) {
  const std::string at = ", got H = " + std::to_string(p.H) + ", I = " + std::to_string(p.I);
  Sm90Problem any = p;  // a shape every tile of the recipe takes
  any.H = any.I = 512;
  bool compiled = false;
  for (const Sm90Config& f : grouped_families(any)) {
    compiled |= f.tile_m == c.tile_m && f.tile_n == c.tile_n && f.mainloop == c.mainloop;
  }
  if (!compiled) return std::string("not a tile of the ") + sm90_recipe_name(p.recipe) + " kernels (they have " + family_list(any) + ")";
  const int64_t slice = p.recipe == Sm90Recipe::bf16                                     ? 64
                        : p.recipe == Sm90Recipe::fp8_row && c.mainloop == Sm90Mainloop::mma ? kFp8RowMinMultiple
                                                                                             : 128;
  if (p.H % slice != 0 || p.I % slice != 0) return "H and I must be multiples of " + std::to_string(slice) + at;
  if (c.mainloop == Sm90Mainloop::mma) {
    return "the 64-row block tiles stage K / 128 scales in shared memory: max(H, I) must be <= " +
           std::to_string(cuda::fused_moe_sm90_grouped_fp8_block_bm64_max_k()) + at;
  }
  return std::string("the 256-column ring tiles need H a multiple of 256 and I a multiple of ") +
         (p.g1u1 ? "128" : "256") + at;
}

// Why config c (of a tile that takes p's shape) cannot run p; empty when it can. Stages: the tile's
// compiled depth (the block mma tiles 4 or 5 per gemm, 5 where K's scales fit beside them);
// schedules: the bf16 ws tiles either per gemm, the others their one; K ranges: 1..max_splits, at
// most one per K slice of gemm2.
std::string illegal(const Sm90Problem& p, const Sm90Config& c) {
  if (c.recipe == Sm90Recipe::fp8_block && c.mainloop == Sm90Mainloop::mma) {
    const int64_t K[2] = {p.H, p.I};
    for (int g = 0; g < 2; ++g) {
      if (c.stages[g] != 4 && c.stages[g] != 5) return "the 64-row block tiles run 4 or 5 stages";
      if (c.stages[g] == 5 && fp8_block_mma_stages(K[g], 0, true, 1) != 5) {
        return "5 stages leave no room for the K / 128 scales of gemm" + std::to_string(g + 1) + " (K = " +
               std::to_string(K[g]) + ")";
      }
    }
  } else if (c.stages[0] != tile_stages(c) || c.stages[1] != tile_stages(c)) {
    return "this tile runs " + std::to_string(tile_stages(c)) + " stages";
  }
  const bool bf16_ws = c.recipe == Sm90Recipe::bf16 && c.mainloop == Sm90Mainloop::ws;
  Sm90Config g = grouped(c.recipe, c.tile_m, c.tile_n, c.mainloop);
  for (int i = 0; i < 2; ++i) {
    if (bf16_ws ? c.sched[i] == Sm90Schedule::grid : c.sched[i] != g.sched[i]) return "schedule not compiled for this tile";
  }
  const int64_t slices = p.I / (c.recipe == Sm90Recipe::bf16 ? 64 : 128);
  if (c.gemm2_splits < 1 || c.gemm2_splits > max_splits(c) || c.gemm2_splits > std::max<int64_t>(slices, 1)) {
    return "gemm2 K ranges must be 1.." + std::to_string(std::min<int64_t>(max_splits(c), std::max<int64_t>(slices, 1))) +
           " for this tile and I, got " + std::to_string(c.gemm2_splits);
  }
  return "";
}

bool parse_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  *out = std::atoi(s.c_str());
  return true;
}

}  // namespace

Sm90Recipe sm90_recipe_of(MoeVariant v) {
  switch (v) {
    case MoeVariant::fp8_block: return Sm90Recipe::fp8_block;
    case MoeVariant::fp8_row:
    case MoeVariant::fp8_row_tkw1: return Sm90Recipe::fp8_row;
    default: break;
  }
  return Sm90Recipe::bf16;
}

const char* sm90_recipe_name(Sm90Recipe r) {
  switch (r) {
    case Sm90Recipe::fp8_row: return "fp8_row";
    case Sm90Recipe::fp8_block: return "fp8_block";
    case Sm90Recipe::bf16: break;
  }
  return "bf16";
}

Sm90Config sm90_small_m_config(Sm90Recipe r) {
  Sm90Config c;
  c.recipe = r;
  return c;
}

Sm90Config sm90_persistent_config(Sm90Recipe r) {
  Sm90Config c = sm90_small_m_config(r);
  c.mainloop = Sm90Mainloop::persistent;
  return c;
}

std::string sm90_persistent_refusal(const Sm90Problem& p) {
  if (p.recipe != Sm90Recipe::fp8_block) {
    return std::string("small_m/persistent is built for fp8_block weights, got ") + sm90_recipe_name(p.recipe);
  }
  if (p.T < 1 || p.T > cuda::kDecodeMaxTokens) {
    return "small_m/persistent takes 1 to " + std::to_string(cuda::kDecodeMaxTokens) + " tokens, got T = " +
           std::to_string(p.T);
  }
  if (p.tk() > cuda::kDecodeMaxSlots) {
    return "small_m/persistent takes T k <= " + std::to_string(cuda::kDecodeMaxSlots) + ", got " + std::to_string(p.tk());
  }
  if (p.H % 128 != 0 || p.I % 128 != 0) {
    return "small_m/persistent needs H and I multiples of 128, got H = " + std::to_string(p.H) +
           ", I = " + std::to_string(p.I);
  }
  return "";
}

std::string sm90_config_name(const Sm90Config& c) {
  if (c.strategy == Sm90Strategy::small_m) {
    return c.mainloop == Sm90Mainloop::persistent ? "small_m/persistent" : "small_m";
  }
  std::string s = "grouped/" + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "." +
                  mainloop_name(c.mainloop) + std::to_string(c.stages[0]);
  if (c.stages[1] != c.stages[0]) s += "." + std::to_string(c.stages[1]);
  if (c.mainloop == Sm90Mainloop::ws && c.recipe == Sm90Recipe::bf16) {
    const bool d1 = c.sched[0] == Sm90Schedule::dynamic, d2 = c.sched[1] == Sm90Schedule::dynamic;
    s += d1 && d2 ? "+dynamic" : d1 ? "+dynamic1" : d2 ? "+dynamic2" : "+static";
  }
  if (max_splits(c) > 1) s += "+k" + std::to_string(c.gemm2_splits);
  return s;
}

bool parse_sm90_config(const std::string& name, Sm90Recipe recipe, Sm90Config* out, std::string* why) {
  Sm90ConfigRequest req;
  if (!parse_sm90_config(name, recipe, &req, why)) return false;
  *out = req.c;
  return true;
}

bool parse_sm90_config(const std::string& name, Sm90Recipe recipe, Sm90ConfigRequest* out, std::string* why) {
  auto fail = [&](const std::string& msg) {
    if (why) *why = "config '" + name + "': " + msg;
    return false;
  };
  *out = Sm90ConfigRequest{};
  if (name == "small_m" || name == "small_m/persistent") {
    out->c = name == "small_m" ? sm90_small_m_config(recipe) : sm90_persistent_config(recipe);
    return true;
  }
  const std::string prefix = "grouped/";
  if (name.compare(0, prefix.size(), prefix) != 0) {
    return fail("must be small_m, small_m/persistent or grouped/MxN.loopS[+options]");
  }
  std::string rest = name.substr(prefix.size());
  std::vector<std::string> options;
  for (size_t plus = rest.find('+'); plus != std::string::npos; plus = rest.find('+')) {
    const size_t next = rest.find('+', plus + 1);
    options.push_back(rest.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1));
    rest = rest.substr(0, plus) + (next == std::string::npos ? "" : rest.substr(next));
  }
  const size_t x = rest.find('x'), dot = rest.find('.');
  if (x == std::string::npos || dot == std::string::npos || dot < x) return fail("the tile must read MxN.loop");
  int m = 0, n = 0;
  if (!parse_int(rest.substr(0, x), &m) || !parse_int(rest.substr(x + 1, dot - x - 1), &n)) {
    return fail("tile sizes must be numbers");
  }
  std::string loop = rest.substr(dot + 1);
  const size_t digit = loop.find_first_of("0123456789");
  const std::string loop_name = loop.substr(0, digit);
  Sm90Mainloop ml;
  if (loop_name == "mma") {
    ml = Sm90Mainloop::mma;
  } else if (loop_name == "ws") {
    ml = Sm90Mainloop::ws;
  } else if (loop_name == "ring") {
    ml = Sm90Mainloop::ring;
  } else {
    return fail("mainloop must be mma, ws or ring, got '" + loop_name + "'");
  }
  Sm90ConfigRequest req;
  Sm90Config& c = req.c;
  c = grouped(recipe, m, n, ml);
  if (digit != std::string::npos) {
    req.stages = true;
    const std::string st = loop.substr(digit);
    const size_t dot2 = st.find('.');
    if (!parse_int(st.substr(0, dot2), &c.stages[0])) return fail("bad stage count");
    c.stages[1] = c.stages[0];
    if (dot2 != std::string::npos && !parse_int(st.substr(dot2 + 1), &c.stages[1])) return fail("bad stage count");
  }
  for (const std::string& o : options) {
    if (o == "dynamic" || o == "static" || o == "dynamic1" || o == "dynamic2") {
      if (ml != Sm90Mainloop::ws || recipe != Sm90Recipe::bf16) return fail("+" + o + ": only bf16 ws tiles choose");
      c.sched[0] = o == "dynamic" || o == "dynamic1" ? Sm90Schedule::dynamic : Sm90Schedule::static_order;
      c.sched[1] = o == "dynamic" || o == "dynamic2" ? Sm90Schedule::dynamic : Sm90Schedule::static_order;
      req.sched = true;
    } else if (o.size() > 1 && o[0] == 'k' && parse_int(o.substr(1), &c.gemm2_splits) && c.gemm2_splits >= 1) {
      req.splits = true;
    } else {
      return fail("unknown option '+" + o + "'");
    }
  }
  *out = req;
  return true;
}

bool resolve_sm90_config(const Sm90Problem& p, const DeviceFacts& dev, const Sm90ConfigRequest& req, Sm90Config* out,
                         std::string* why) {
  const Sm90Config& c = req.c;
  if (c.strategy == Sm90Strategy::small_m) {
    const std::string bad = c.mainloop == Sm90Mainloop::persistent ? sm90_persistent_refusal(p) : "";
    if (!bad.empty()) {
      if (why) *why = "config 'small_m/persistent': " + bad;
      return false;
    }
    *out = c;
    return true;
  }
  const std::string name = sm90_config_name(c);
  Sm90Config r;
  bool found = false;
  for (const Sm90Config& f : grouped_families(p)) {
    if (f.tile_m == c.tile_m && f.tile_n == c.tile_n && f.mainloop == c.mainloop) {
      r = f;
      found = true;
    }
  }
  if (!found) {
    if (why) *why = "config '" + name.substr(0, name.find_first_of("+")) + "': " + tile_refusal(p, c);
    return false;
  }
  resolve(p, dev, &r);
  if (req.stages) std::copy(c.stages, c.stages + 2, r.stages);
  if (req.sched) std::copy(c.sched, c.sched + 2, r.sched);
  if (req.splits) r.gemm2_splits = c.gemm2_splits;
  const std::string bad = illegal(p, r);
  if (!bad.empty()) {
    if (why) *why = "config '" + sm90_config_name(r) + "': " + bad;
    return false;
  }
  *out = r;
  return true;
}

std::vector<Sm90Config> legal_sm90_configs(const Sm90Problem& p, const DeviceFacts& dev) {
  std::vector<Sm90Config> out = {sm90_small_m_config(p.recipe)};
  if (sm90_persistent_refusal(p).empty()) out.push_back(sm90_persistent_config(p.recipe));
  for (Sm90Config f : grouped_families(p)) {
    resolve(p, dev, &f);
    const bool block_mma = f.recipe == Sm90Recipe::fp8_block && f.mainloop == Sm90Mainloop::mma;
    const bool bf16_ws = f.recipe == Sm90Recipe::bf16 && f.mainloop == Sm90Mainloop::ws;
    // Stage pairs: the block mma tiles 4 or 5 per gemm, the others their one depth.
    for (int st = 0; st < (block_mma ? 4 : 1); ++st) {
      for (int d = 0; d < (bf16_ws ? 4 : 1); ++d) {
        for (int k = 1; k <= max_splits(f); ++k) {
          Sm90Config c = f;
          if (block_mma) c.stages[0] = st & 1 ? 5 : 4, c.stages[1] = st & 2 ? 5 : 4;
          if (bf16_ws) {
            c.sched[0] = d & 1 ? Sm90Schedule::dynamic : Sm90Schedule::static_order;
            c.sched[1] = d & 2 ? Sm90Schedule::dynamic : Sm90Schedule::static_order;
          }
          c.gemm2_splits = k;
          if (illegal(p, c).empty()) out.push_back(c);
        }
      }
    }
  }
  return out;
}

Sm90Config select_sm90_grouped_config(const Sm90Problem& p, const DeviceFacts& dev) {
  // S4-S9: the grouped tile, then its stages, schedules and K ranges.
  Sm90Config c = pick_grouped(p);
  resolve(p, dev, &c);
  return c;
}

Sm90Config select_sm90_config(const Sm90Problem& p, const DeviceFacts& dev) {
  // S1: the preferred strategy (D1; D3 then D2 for the fp8 recipes).
  const MoeStrategy s = p.recipe == Sm90Recipe::bf16 ? choose_moe_strategy(p.T, p.k, p.Eg > 0 ? p.Eg : p.E).strategy
                                                     : choose_moe_strategy_fp8_tma64(p.T, p.k, p.E, p.H, dev).strategy;
  if (s == MoeStrategy::small_m) return sm90_small_m_config(p.recipe);
  return select_sm90_grouped_config(p, dev);
}

}  // namespace moekit
