// select_sm90_config (fused_moe_sm90_config.h) against today's choices: every row of
// tests/data/fused_moe_sm90_choices.csv (written from the rules the launch code runs; see
// test_fused_moe_sm90_tiles.cpp), for the three recipes; the pick is one of legal_sm90_configs;
// config names parse back; a device with fewer SMs changes only the SM-count rules.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_facts.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "test_data_dir.h"

namespace moekit::testing {
namespace {

using Row = std::map<std::string, std::string>;

std::vector<Row> golden_rows() {
  std::ifstream in(test_data_dir() + "/fused_moe_sm90_choices.csv");
  std::vector<Row> rows;
  std::vector<std::string> cols;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (cols.empty()) {
      cols = cells;
      continue;
    }
    Row r;
    for (size_t i = 0; i < cols.size() && i < cells.size(); ++i) r[cols[i]] = cells[i];
    rows.push_back(r);
  }
  return rows;
}

Sm90Problem problem_of(const Row& r, Sm90Recipe recipe) {
  Sm90Problem p;
  p.recipe = recipe;
  p.E = p.Eg = std::stoll(r.at("E"));
  p.k = std::stoll(r.at("k"));
  p.T = std::stoll(r.at("T"));
  p.H = std::stoll(r.at("H"));
  p.I = std::stoll(r.at("I"));
  p.g1u1 = r.at("g1u1") == "1";
  return p;
}

std::string strategy_of(const Sm90Config& c) {
  return c.strategy == Sm90Strategy::small_m ? "small_m" : "grouped_gemm";
}

// The golden's fp8 tile names as configs' (tile, mainloop).
std::string tiles_of(const Sm90Config& c) {
  const std::string t = std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n);
  return c.mainloop == Sm90Mainloop::mma ? t + ".mma" : t;
}

TEST(FusedMoeSm90Config, SelectReproducesTodaysChoices) {
  const std::vector<Row> rows = golden_rows();
  ASSERT_GT(rows.size(), 1000u) << "tests/data/fused_moe_sm90_choices.csv";
  int failures = 0;
  for (const Row& r : rows) {
    const std::string at = "E=" + r.at("E") + " k=" + r.at("k") + " T=" + r.at("T") + " H=" + r.at("H") +
                           " I=" + r.at("I") + " g1u1=" + r.at("g1u1");
    const Sm90Config b = select_sm90_config(problem_of(r, Sm90Recipe::bf16), kH200Facts);
    const Sm90Config f = select_sm90_config(problem_of(r, Sm90Recipe::fp8_row), kH200Facts);
    const Sm90Config k = select_sm90_config(problem_of(r, Sm90Recipe::fp8_block), kH200Facts);
    std::vector<std::string> bad;
    if (strategy_of(b) != r.at("bf16_strategy")) bad.push_back("bf16 strategy " + sm90_config_name(b));
    if (b.strategy == Sm90Strategy::grouped) {
      const bool d1 = b.sched[0] == Sm90Schedule::dynamic, d2 = b.sched[1] == Sm90Schedule::dynamic;
      if (std::to_string(b.tile_m) != r.at("bf16_tile_m")) bad.push_back("bf16 tile " + sm90_config_name(b));
      const bool sched_ok = std::to_string(int(d1)) == r.at("bf16_dynamic_gemm1") &&
                            std::to_string(int(d2)) == r.at("bf16_dynamic_gemm2");
      const bool splits_ok = std::to_string(b.gemm2_splits) == r.at("bf16_gemm2_splits");
      if (b.mainloop == Sm90Mainloop::ws && (!splits_ok || !sched_ok)) {
        bad.push_back("bf16 schedule / K ranges " + sm90_config_name(b));
      }
    }
    if (strategy_of(f) != r.at("fp8_strategy")) bad.push_back("fp8_row strategy " + sm90_config_name(f));
    if (strategy_of(k) != r.at("fp8_strategy")) bad.push_back("fp8_block strategy " + sm90_config_name(k));
    if (f.strategy == Sm90Strategy::grouped) {
      if (tiles_of(f) != r.at("fp8_row_tiles")) bad.push_back("fp8_row tiles " + sm90_config_name(f));
      if (f.mainloop == Sm90Mainloop::ring && std::to_string(f.gemm2_splits) != r.at("tma64_gemm2_splits")) {
        bad.push_back("fp8_row K ranges " + sm90_config_name(f));
      }
    }
    if (k.strategy == Sm90Strategy::grouped) {
      if (tiles_of(k) != r.at("fp8_block_tiles")) bad.push_back("fp8_block tiles " + sm90_config_name(k));
      if (k.mainloop == Sm90Mainloop::mma && (std::to_string(k.stages[0]) != r.at("block_mma_stages1") ||
                                              std::to_string(k.stages[1]) != r.at("block_mma_stages2"))) {
        bad.push_back("fp8_block stages " + sm90_config_name(k));
      }
      if (k.tile_m == 64 && k.mainloop == Sm90Mainloop::ring &&
          std::to_string(k.gemm2_splits) != r.at("tma64_gemm2_splits")) {
        bad.push_back("fp8_block K ranges " + sm90_config_name(k));
      }
    }
    for (const std::string& what : bad) {
      if (failures++ < 20) ADD_FAILURE() << at << ": " << what;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(FusedMoeSm90Config, PickIsLegalAndNamesParseBack) {
  for (const Row& r : golden_rows()) {
    for (Sm90Recipe recipe : {Sm90Recipe::bf16, Sm90Recipe::fp8_row, Sm90Recipe::fp8_block}) {
      const Sm90Problem p = problem_of(r, recipe);
      const std::vector<Sm90Config> legal = legal_sm90_configs(p, kH200Facts);
      const Sm90Config pick = select_sm90_config(p, kH200Facts);
      bool found = false;
      for (const Sm90Config& c : legal) {
        found = found || c == pick;
        Sm90Config back;
        std::string why;
        ASSERT_TRUE(parse_sm90_config(sm90_config_name(c), recipe, &back, &why)) << why;
        EXPECT_TRUE(back == c) << sm90_config_name(c) << " -> " << sm90_config_name(back);
      }
      EXPECT_TRUE(found) << sm90_config_name(pick) << " is not among the legal configs of T=" << p.T << " E=" << p.E;
    }
  }
}

TEST(FusedMoeSm90Config, Names) {
  Sm90Problem p;  // Mixtral T = 512, bf16: 128 x 256 ws, gemm1 N = 28672 and gemm2 N = 4096 dynamic
  p.recipe = Sm90Recipe::bf16;
  p.T = 512, p.k = 2, p.E = p.Eg = 8, p.H = 4096, p.I = 14336;
  EXPECT_EQ(sm90_config_name(select_sm90_config(p, kH200Facts)), "grouped/128x256.ws4+dynamic+k2");
  p.recipe = Sm90Recipe::fp8_block;  // DeepSeek-V3 T = 4096: 64 x 256 ring, 128 rows per expert
  p.T = 4096, p.k = 8, p.E = p.Eg = 256, p.H = 7168, p.I = 2048;
  EXPECT_EQ(sm90_config_name(select_sm90_config(p, kH200Facts)), "grouped/64x256.ring5+k1");
  p.T = 1;  // one token: small_m? No: H % 256 == 0 keeps fp8 grouped (64 x 256 ring, K ranges)
  EXPECT_EQ(sm90_config_name(select_sm90_config(p, kH200Facts)), "grouped/64x256.ring5+k1");
  Sm90Config c;
  std::string why;
  EXPECT_TRUE(parse_sm90_config("small_m", Sm90Recipe::fp8_row, &c, &why));
  EXPECT_EQ(c.strategy, Sm90Strategy::small_m);
  EXPECT_TRUE(parse_sm90_config("grouped/64x256.mma4.5", Sm90Recipe::fp8_block, &c, &why)) << why;
  EXPECT_EQ(c.stages[0], 4);
  EXPECT_EQ(c.stages[1], 5);
  EXPECT_FALSE(parse_sm90_config("grouped/64x256.wgmma4", Sm90Recipe::bf16, &c, &why));
  EXPECT_NE(why.find("mainloop must be mma, ws or ring"), std::string::npos) << why;
  EXPECT_FALSE(parse_sm90_config("grouped/128x256.ws4+dynamic", Sm90Recipe::fp8_row, &c, &why));
  EXPECT_NE(why.find("only bf16 ws tiles choose"), std::string::npos) << why;
  EXPECT_FALSE(parse_sm90_config("grouped/128x256.ws4+fast", Sm90Recipe::bf16, &c, &why));
  EXPECT_FALSE(parse_sm90_config("tiles/128x256", Sm90Recipe::bf16, &c, &why));
}

// Explicit configs: what a name leaves out follows the rules; what it gives must be compiled for the
// tile and take the shape, else the refusal says why.
TEST(FusedMoeSm90Config, ExplicitConfigsResolveOrSayWhyNot) {
  Sm90Problem p;  // Mixtral T = 1, fp8 blocks: the rules pick the 64 x 256 ring with 4 K ranges
  p.recipe = Sm90Recipe::fp8_block;
  p.T = 1, p.k = 2, p.E = p.Eg = 8, p.H = 4096, p.I = 14336;
  auto resolve = [&](const std::string& name, std::string* why) {
    Sm90ConfigRequest req;
    Sm90Config c;
    if (!parse_sm90_config(name, p.recipe, &req, why)) return std::string("parse: ") + *why;
    return resolve_sm90_config(p, kH200Facts, req, &c, why) ? sm90_config_name(c) : "refused: " + *why;
  };
  std::string why;
  EXPECT_EQ(resolve("grouped/64x256.ring", &why), "grouped/64x256.ring5+k4");
  EXPECT_EQ(resolve("grouped/64x256.ring5+k2", &why), "grouped/64x256.ring5+k2");
  EXPECT_EQ(resolve("grouped/64x256.mma", &why), "grouped/64x256.mma4");  // I = 14336: no room for 5
  EXPECT_NE(resolve("grouped/64x256.mma5", &why).find("5 stages leave no room"), std::string::npos) << why;
  EXPECT_EQ(resolve("grouped/64x256.mma5.4", &why), "grouped/64x256.mma5.4");
  EXPECT_NE(resolve("grouped/64x256.ring5+k5", &why).find("K ranges must be 1..4"), std::string::npos) << why;
  EXPECT_NE(resolve("grouped/128x128.ring7+k2", &why).find("K ranges must be 1..1"), std::string::npos) << why;
  EXPECT_NE(resolve("grouped/128x128.ring4", &why).find("this tile runs 7 stages"), std::string::npos) << why;
  EXPECT_NE(resolve("grouped/192x256.ws3", &why).find("not a tile of the fp8_block kernels"), std::string::npos);
  p.H = 4224;  // not a multiple of 256: the ring tiles refuse, the 128 x 128 one takes it
  EXPECT_NE(resolve("grouped/64x256.ring5", &why).find("H a multiple of 256"), std::string::npos) << why;
  EXPECT_EQ(resolve("grouped/128x128.ring7", &why), "grouped/128x128.ring7");
  p.recipe = Sm90Recipe::bf16;
  p.H = 4096;
  EXPECT_EQ(resolve("grouped/128x256.ws4+static", &why), "grouped/128x256.ws4+static+k2");
  EXPECT_EQ(resolve("grouped/128x256.ws4+dynamic2+k1", &why), "grouped/128x256.ws4+dynamic2+k1");
  EXPECT_NE(resolve("grouped/128x256.ws4+k3", &why).find("K ranges must be 1..2"), std::string::npos) << why;
  EXPECT_EQ(resolve("small_m", &why), "small_m");
}

// fp8_row off the 128 grid (gpt-oss: H = I = 2880): only the 64 x 256 mma tile takes the shape, the
// rules pick it at every T where they go grouped, and the TMA tiles refuse with the sizes (E133).
TEST(FusedMoeSm90Config, Fp8RowOffThe128GridTakesTheMmaTile) {
  Sm90Problem p;
  p.recipe = Sm90Recipe::fp8_row;
  p.k = 4, p.E = p.Eg = 128, p.H = 2880, p.I = 2880;
  for (int64_t T : {16, 128, 1024, 4096}) {
    p.T = T;
    EXPECT_EQ(sm90_config_name(select_sm90_config(p, kH200Facts)), "grouped/64x256.mma4") << "T = " << T;
    std::set<std::string> names;
    for (const Sm90Config& c : legal_sm90_configs(p, kH200Facts)) names.insert(sm90_config_name(c));
    EXPECT_EQ(names, (std::set<std::string>{"small_m", "grouped/64x256.mma4"})) << "T = " << T;
  }
  std::string why;
  Sm90ConfigRequest req;
  Sm90Config c;
  ASSERT_TRUE(parse_sm90_config("grouped/128x256.ws4", p.recipe, &req, &why)) << why;
  EXPECT_FALSE(resolve_sm90_config(p, kH200Facts, req, &c, &why));
  EXPECT_NE(why.find("multiples of 128, got H = 2880"), std::string::npos) << why;
  p.H = 2880 + 16;  // off the 32 grid: no grouped tile
  ASSERT_TRUE(parse_sm90_config("grouped/64x256.mma4", p.recipe, &req, &why)) << why;
  EXPECT_FALSE(resolve_sm90_config(p, kH200Facts, req, &c, &why));
  EXPECT_NE(why.find("multiples of 32, got H = 2896"), std::string::npos) << why;
}

// The sweep's configs: every compiled stage pair, schedule and K range count of each tile that takes
// the shape, each legal and named uniquely.
TEST(FusedMoeSm90Config, LegalConfigsEnumerateTheVariants) {
  Sm90Problem p;
  p.recipe = Sm90Recipe::fp8_block;
  p.T = 64, p.k = 8, p.E = p.Eg = 256, p.H = 7168, p.I = 2048;  // DeepSeek-V3
  std::set<std::string> names;
  for (const Sm90Config& c : legal_sm90_configs(p, kH200Facts)) names.insert(sm90_config_name(c));
  for (const char* n : {"small_m", "grouped/64x256.ring5+k1", "grouped/64x256.ring5+k4", "grouped/64x256.mma4",
                        "grouped/64x256.mma5", "grouped/64x256.mma4.5", "grouped/64x256.mma5.4",
                        "grouped/128x256.ring4", "grouped/128x128.ring7"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  EXPECT_EQ(names.size(), 1u + 4 + 4 + 1 + 1);
  p.recipe = Sm90Recipe::bf16;
  names.clear();
  for (const Sm90Config& c : legal_sm90_configs(p, kH200Facts)) names.insert(sm90_config_name(c));
  EXPECT_EQ(names.size(), 1u + 1 + 4 * 2);  // small_m, 64x256.mma4, 128x256.ws4 x 4 schedules x 2 K ranges
}

// small_m/persistent (the one-launch fp8_block decode): parses, names itself, is legal for fp8_block
// at 1-8 tokens with H and I multiples of 128, refuses the rest with the reason, and is never the
// rules' pick.
TEST(FusedMoeSm90Config, PersistentDecodeConfig) {
  Sm90Problem p;
  p.recipe = Sm90Recipe::fp8_block;
  p.T = 1, p.k = 8, p.E = p.Eg = 256, p.H = 7168, p.I = 2048;  // DeepSeek-V3
  Sm90ConfigRequest req;
  std::string why;
  ASSERT_TRUE(parse_sm90_config("small_m/persistent", p.recipe, &req, &why)) << why;
  EXPECT_EQ(req.c.strategy, Sm90Strategy::small_m);
  EXPECT_EQ(req.c.mainloop, Sm90Mainloop::persistent);
  EXPECT_EQ(sm90_config_name(req.c), "small_m/persistent");
  for (int64_t T : {1, 8}) {
    p.T = T;
    Sm90Config c;
    EXPECT_TRUE(resolve_sm90_config(p, kH200Facts, req, &c, &why)) << why;
    std::set<std::string> names;
    for (const Sm90Config& l : legal_sm90_configs(p, kH200Facts)) names.insert(sm90_config_name(l));
    EXPECT_EQ(names.count("small_m/persistent"), 1u) << "T=" << T;
    EXPECT_NE(sm90_config_name(select_sm90_config(p, kH200Facts)), "small_m/persistent");
  }
  auto refusal = [&](const Sm90Problem& q) {
    Sm90Config c;
    std::string w;
    EXPECT_FALSE(resolve_sm90_config(q, kH200Facts, req, &c, &w));
    for (const Sm90Config& l : legal_sm90_configs(q, kH200Facts)) EXPECT_NE(sm90_config_name(l), "small_m/persistent");
    return w;
  };
  Sm90Problem q = p;
  q.T = 9;
  EXPECT_NE(refusal(q).find("takes 1 to 8 tokens, got T = 9"), std::string::npos);
  q = p;
  q.recipe = Sm90Recipe::fp8_row;
  EXPECT_NE(refusal(q).find("built for fp8_block weights, got fp8_row"), std::string::npos);
  q = p;
  q.H = 7232;
  EXPECT_NE(refusal(q).find("multiples of 128"), std::string::npos);
  q = p;
  q.T = 8, q.k = 33;
  EXPECT_NE(refusal(q).find("T k <= 256"), std::string::npos);
}

// A device with fewer SMs changes the SM-count rules only: Mixtral fp8 T = 1 splits its 64 x 256
// ring down GEMM into fewer K ranges.
TEST(FusedMoeSm90Config, FewerSmsChangeOnlyTheSmCountRules) {
  DeviceFacts small = kH200Facts;
  small.sm_count = 64;
  Sm90Problem p;
  p.recipe = Sm90Recipe::fp8_row;
  p.T = 1, p.k = 2, p.E = p.Eg = 8, p.H = 4096, p.I = 14336;
  const Sm90Config h200 = select_sm90_config(p, kH200Facts), few = select_sm90_config(p, small);
  EXPECT_EQ(h200.gemm2_splits, 4);
  EXPECT_EQ(few.gemm2_splits, 2);
  Sm90Config same = few;
  same.gemm2_splits = h200.gemm2_splits;
  EXPECT_TRUE(same == h200) << sm90_config_name(few);
}

}  // namespace
}  // namespace moekit::testing
