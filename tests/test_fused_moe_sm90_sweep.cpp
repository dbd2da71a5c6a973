// The rules' configs against a recorded H200 sweep (tests/data/fused_moe_sm90_sweep.csv, written by
// `STEPS=sweep scripts/gpu_run.sh` and scripts/sweep_csv.py: every config the auto kernels can run,
// per shape (presets and custom E, k, H, I; g1u1), scheme and T).
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

// (model, scheme, T) -> the times of its configs.
std::map<std::string, Cell> load_sweep(std::string* why) {
  std::ifstream in(test_data_dir() + "/fused_moe_sm90_sweep.csv");
  std::map<std::string, Cell> cells;
  std::map<std::string, size_t> col;
  std::string line;
  if (!std::getline(in, line)) {
    *why = "tests/data/fused_moe_sm90_sweep.csv is missing or empty";
    return cells;
  }
  const std::vector<std::string> head = split_csv_line(line);
  for (size_t i = 0; i < head.size(); ++i) col[head[i]] = i;
  for (const char* c : {"model", "scheme", "tokens", "E", "k", "H", "I", "config", "time_us", "status"}) {
    if (!col.count(c)) *why = std::string("column ") + c + " missing";
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

Sm90Problem problem_of(const Cell& c, const std::string& scheme, int64_t T) {
  Sm90Problem p;
  p.recipe = scheme == "bf16" ? Sm90Recipe::bf16 : scheme == "fp8_block" ? Sm90Recipe::fp8_block : Sm90Recipe::fp8_row;
  p.T = T, p.k = c.k, p.E = p.Eg = c.E, p.H = c.H, p.I = c.I;
  p.g1u1 = true;
  return p;
}

TEST(FusedMoeSm90Sweep, PicksAreWithinTheMarginOfTheFastestMeasured) {
  std::string why;
  const std::map<std::string, Cell> cells = load_sweep(&why);
  ASSERT_TRUE(why.empty()) << why;
  ASSERT_GE(cells.size(), 30u) << "the recorded sweep should cover the presets x schemes x T grid";
  int checked = 0;
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
      ADD_FAILURE() << key << ": the pick " << pick << " was not measured (re-record the sweep)";
      continue;
    }
    EXPECT_LE(it->second, best * (1 + kMargin))
        << key << ": pick " << pick << " " << it->second << " us, fastest " << best_name << " " << best << " us";
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

}  // namespace
}  // namespace moekit::testing
