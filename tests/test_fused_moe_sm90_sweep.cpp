// The rules' configs against recorded H200 sweeps (written by `STEPS=sweep scripts/gpu_run.sh` and
// scripts/sweep_csv.py: every config the auto kernels can run, per shape, scheme and T):
// tests/data/fused_moe_sm90_sweep.csv (the presets) and tests/data/fused_moe_sm90_sweep_shapes.csv
// (eight shapes, E 8-384, k 1-8, H 2048-7168, I 768-14336, partly untuned for: Kimi-K2, Qwen3-235B,
// DeepSeek-V2-Lite, Llama-4-Scout, Phi-3.5-MoE and the presets' shapes at other T).
// For each recorded problem, the config select_sm90_config picks today, for the H200's facts, must
// have been measured and be within kMargin of the fastest config measured for that problem. A rule
// change that moves a pick off the recorded grid, or onto a slow config, fails here; then re-record.
// Host-only: reads the CSV, no device. docs/fused_moe_configs.md, docs/PERF.md ("Config sweep").
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_facts.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "test_data_dir.h"

namespace moekit::testing {
namespace {

// How far above the fastest measured config the pick may be. In the 2026-12-03 sweep (45 problems)
// the pick was the fastest in 40 and at most 3.1% behind in the others (Qwen3 bf16 T = 512: 128 x 256
// ws would win; Mixtral fp8_tensor T = 512: 192 x 256); same-binary repeats move by ~1-2%.
constexpr double kMargin = 0.05;

struct Cell {
  int64_t E = 0, k = 0, H = 0, I = 0;
  std::map<std::string, double> us;  // config -> median time
};

std::vector<std::string> split_csv_line(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files too
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
  return cells;
}

// (model, scheme, T) -> the times of its configs, from tests/data/<file>.
std::map<std::string, Cell> load_sweep(const std::string& file, std::string* why) {
  std::ifstream in(test_data_dir() + "/" + file);
  std::map<std::string, Cell> cells;
  std::map<std::string, size_t> col;
  std::string line;
  if (!std::getline(in, line)) {
    *why = "tests/data/" + file + " is missing or empty";
    return cells;
  }
  const std::vector<std::string> head = split_csv_line(line);
  for (size_t i = 0; i < head.size(); ++i) col[head[i]] = i;
  for (const char* c : {"model", "scheme", "tokens", "E", "k", "H", "I", "config", "time_us", "status"}) {
    if (!col.count(c)) *why = file + ": column " + c + " missing";
  }
  if (!why->empty()) return cells;
  while (std::getline(in, line)) {
    const std::vector<std::string> r = split_csv_line(line);
    if (r.size() < head.size() || r[col["status"]] != "ok" || r[col["time_us"]].empty()) continue;
    const std::string key = r[col["model"]] + "|" + r[col["scheme"]] + "|" + r[col["tokens"]];
    Cell& c = cells[key];
    c.E = std::stoll(r[col["E"]]), c.k = std::stoll(r[col["k"]]), c.H = std::stoll(r[col["H"]]);
    c.I = std::stoll(r[col["I"]]);
    c.us[r[col["config"]]] = std::stod(r[col["time_us"]]);
  }
  return cells;
}

// Known misses beyond kMargin, each with the most it may be behind and why. Phi-3.5-MoE T = 8 (256
// gemm2 tiles, 1.94 waves): 2-4 K ranges measured 5-6% faster than the one the rule gives; the only
// such cell of the sweeps, and more ranges at ~2 waves lost elsewhere (E41). Llama-4-Scout fp8_block
// T = 4096 (256 rows per expert): 64 x 256 5.6% faster, where Qwen3-30B / -235B at 256 rows measured
// 128 x 256 1-2% faster; the padding rule keeps 128 rows there (E108).
const std::map<std::string, double> kKnownMisses = {
    {"phi3.5-moe|fp8_block|8", 0.07},
    {"phi3.5-moe|fp8_tensor|8", 0.07},
    {"llama4-scout|fp8_block|4096", 0.07},
};

Sm90Problem problem_of(const Cell& c, const std::string& scheme, int64_t T) {
  Sm90Problem p;
  p.recipe = scheme == "bf16" ? Sm90Recipe::bf16 : scheme == "fp8_block" ? Sm90Recipe::fp8_block : Sm90Recipe::fp8_row;
  p.T = T, p.k = c.k, p.E = p.Eg = c.E, p.H = c.H, p.I = c.I;
  p.g1u1 = true;
  return p;
}

void expect_picks_near_fastest(const std::string& file, size_t min_cells) {
  std::string why;
  const std::map<std::string, Cell> cells = load_sweep(file, &why);
  ASSERT_TRUE(why.empty()) << why;
  ASSERT_GE(cells.size(), min_cells) << file;
  size_t checked = 0;
  for (const auto& [key, cell] : cells) {
    std::stringstream ks(key);
    std::string model, scheme, tokens;
    std::getline(ks, model, '|');
    std::getline(ks, scheme, '|');
    std::getline(ks, tokens, '|');
    const Sm90Problem p = problem_of(cell, scheme, std::stoll(tokens));
    const std::string pick = sm90_config_name(select_sm90_config(p, kH200Facts));
    double best = INFINITY;
    std::string best_name;
    for (const auto& [name, us] : cell.us) {
      if (us < best) best = us, best_name = name;
    }
    const auto it = cell.us.find(pick);
    if (it == cell.us.end()) {
      ADD_FAILURE() << file << " " << key << ": the pick " << pick << " was not measured (re-record the sweep)";
      continue;
    }
    const auto known = kKnownMisses.find(key);
    const double margin = known != kKnownMisses.end() ? known->second : kMargin;
    EXPECT_LE(it->second, best * (1 + margin)) << file << " " << key << ": pick " << pick << " " << it->second
                                                << " us, fastest " << best_name << " " << best << " us";
    ++checked;
  }
  EXPECT_GE(checked, min_cells);
}

TEST(FusedMoeSm90Sweep, PicksAreWithinTheMarginOfTheFastestMeasured) {
  expect_picks_near_fastest("fused_moe_sm90_sweep.csv", 30);
}

TEST(FusedMoeSm90Sweep, PicksOnOtherShapesAreWithinTheMargin) {
  expect_picks_near_fastest("fused_moe_sm90_sweep_shapes.csv", 100);
}

}  // namespace
}  // namespace moekit::testing
