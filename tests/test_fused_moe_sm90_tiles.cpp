// The CUDA fused_moe choices as host functions, pinned over a grid of problems by a golden table
// (tests/data/fused_moe_sm90_choices.csv), on the H200's facts: the bf16 and fp8 strategies; the bf16
// M tile, gemm2 K ranges and schedules; the fp8 per-row and block tiles of the grouped path and the
// tma64 gemm2 K ranges; the block mma tiles' stages per gemm. Not in it: small_m's limits (the .cu).
// The redesign of issue 31 (docs/design/fused_moe_sm90.md, M3) must reproduce every row.
// MOEKIT_WRITE_GOLDEN=1 rewrites the table from the current rules (review the diff: a changed row is
// a changed kernel choice, to be measured).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_facts.h"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_tiles.h"
#include "test_data_dir.h"

namespace moekit::testing {
namespace {

const char* strategy(MoeStrategy s) { return moe_strategy_name(s); }

// One CSV row per (E, k, T, H, I, g1u1): the header line below names the columns.
std::vector<std::string> current_choices() {
  const DeviceFacts& dev = kH200Facts;
  std::vector<std::string> rows = {
      "E,k,T,H,I,g1u1,bf16_strategy,bf16_tile_m,bf16_gemm2_splits,bf16_dynamic_gemm1,bf16_dynamic_gemm2,fp8_strategy,"
      "fp8_row_tiles,fp8_block_tiles,tma64_gemm2_splits,block_mma_stages1,block_mma_stages2"};
  const int64_t ek[][2] = {{8, 2}, {16, 1}, {64, 6}, {128, 8}, {256, 8}};
  const int64_t tokens[] = {1,   2,   3,   4,   6,   7,   8,   12,   16,   24,   32,   48,   64,   96,   128,
                            192, 193, 256, 384, 512, 513, 640, 768, 1024, 1536, 2048, 3072, 4096, 5120, 8192};
  // Mixtral, DeepSeek-V3, Qwen3-30B-A3B, Llama-4 presets; a small one; an H the 256-column tiles refuse.
  const int64_t hi[][2] = {{4096, 14336}, {7168, 2048}, {2048, 768}, {5120, 8192}, {384, 256}, {4224, 1408}};
  for (const auto& e : ek) {
    for (int64_t T : tokens) {
      for (const auto& s : hi) {
        for (bool g1u1 : {true, false}) {
          const int64_t E = e[0], k = e[1], H = s[0], I = s[1], tk = T * k;
          const bool tma256 = fp8_tma256_takes(H, I, g1u1);
          const bool mma64_fits = fp8_block_mma64_fits(H, I);
          const Fp8BlockMmaStages mma_stages = fp8_block_mma_gemm_stages(
              cuda::fused_moe_sm90_grouped_tiles_max(tk, E, 64), H, I, g1u1, false, dev.sm_count);
          // bf16 (E = Eg here): the M tile, and gemm2's K ranges on the TMA path (128 x 256 tiles,
          // K slices of 64), as fused_moe_sm90_grouped.cu's layout_of computes them.
          const int bm = cuda::fused_moe_sm90_grouped_tile_m(tk, E);
          const int bf16_splits =
              cuda::fused_moe_sm90_grouped_uses_tma(bm)
                  ? cuda::fused_moe_sm90_grouped_gemm2_splits(cuda::fused_moe_sm90_grouped_tiles_max(tk, E, bm),
                                                              (H + 255) / 256, I / 64, dev.sm_count)
                  : 1;
          std::ostringstream os;
          os << E << ',' << k << ',' << T << ',' << H << ',' << I << ',' << g1u1 << ','
             << strategy(choose_moe_strategy(T, k, E).strategy) << ','
             << bm << ',' << bf16_splits << ',' << fused_moe_sm90_grouped_ws_dynamic(g1u1 ? 2 * I : I) << ','
             << fused_moe_sm90_grouped_ws_dynamic(H) << ','
             << strategy(choose_moe_strategy_fp8_tma64(T, k, E, H, dev).strategy) << ','
             << fp8_row_tiles_name(fp8_row_tiles(tk, E, tma256)) << ','
             << fp8_block_tiles_name(fp8_block_tiles(tk, E, tma256, mma64_fits)) << ','
             << (tma256 ? fused_moe_sm90_tma64_gemm2_splits(tk, E, H / 256, I / 128, dev.sm_count) : 1) << ','
             << mma_stages.gemm1 << ',' << mma_stages.gemm2;
          rows.push_back(os.str());
        }
      }
    }
  }
  return rows;
}

TEST(FusedMoeSm90Choices, MatchTheGoldenTable) {
  const std::string path = test_data_dir() + "/fused_moe_sm90_choices.csv";
  const std::vector<std::string> now = current_choices();
  const char* write = std::getenv("MOEKIT_WRITE_GOLDEN");
  if (write != nullptr && std::string(write) == "1") {
    std::ofstream out(path);
    for (const std::string& r : now) out << r << '\n';
    ASSERT_TRUE(out.good()) << path;
    GTEST_SKIP() << "wrote " << now.size() << " rows to " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " missing (MOEKIT_WRITE_GOLDEN=1 writes it)";
  std::vector<std::string> golden;
  for (std::string line; std::getline(in, line);) golden.push_back(line);
  ASSERT_EQ(golden.size(), now.size()) << path << ": the grid changed";
  int shown = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    if (golden[i] != now[i] && shown++ < 10) {
      ADD_FAILURE() << "row " << i << ": golden " << golden[i] << "\n now    " << now[i];
    }
  }
  EXPECT_EQ(shown, 0) << "choices changed from " << path;
}

}  // namespace
}  // namespace moekit::testing
