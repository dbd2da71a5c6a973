// Expert parallelism (include/moekit/ep.h): the plan against a brute-force count, validation
// messages, the single-process multi-rank host simulation against the single-device fused_moe
// (2 and 4 ranks, uneven token loads, a rank with no tokens, a rank that receives nothing), and
// the NCCL runner against the single-GPU result (Nccl* cases: skipped without >= world GPUs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moekit/ep.h"
#include "testing/harness.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moekit {
namespace {

using testing::Buffer;
using testing::Rng;

// Random routing for T tokens: k distinct ids per token from [lo, hi), some slots -1 when holes.
std::vector<int32_t> routing(Rng& rng, int64_t T, int k, int lo, int hi, bool holes) {
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool;
    for (int g = lo; g < hi; ++g) pool.push_back(g);
    std::shuffle(pool.begin(), pool.end(), rng.gen);
    for (int j = 0; j < k; ++j) ids[size_t(t * k + j)] = (holes && rng.integer(0, 5) == 0) ? -1 : pool[size_t(j)];
  }
  return ids;
}

TEST(Ep, PlanMatchesBruteForce) {
  Rng rng(3);
  const int world = 3, Eg = 12, k = 4;
  const std::vector<int64_t> tokens = {5, 0, 9};
  std::vector<std::vector<int32_t>> ids;
  for (int64_t T : tokens) ids.push_back(routing(rng, T, k, 0, Eg, true));
  std::vector<const int32_t*> ptrs;
  for (auto& v : ids) ptrs.push_back(v.data());
  ep::Plan plan;
  ASSERT_TRUE(ep::make_plan(world, Eg, k, ptrs, tokens, &plan).ok());
  for (int s = 0; s < world; ++s) {
    int64_t row = 0;
    for (int d = 0; d < world; ++d) {
      int64_t n = 0;
      for (int64_t t = 0; t < tokens[s]; ++t) {
        bool any = false;
        for (int j = 0; j < k; ++j) any |= ids[s][t * k + j] >= 0 && ids[s][t * k + j] / (Eg / world) == d;
        EXPECT_EQ(plan.combine_row[s][t * world + d], any ? int32_t(row) : -1) << s << " " << t << " " << d;
        if (any) {
          EXPECT_EQ(plan.send_token[s][size_t(row)], t);
          ++n;
          ++row;
        }
      }
      EXPECT_EQ(plan.count[s * world + d], n);
    }
    EXPECT_EQ(plan.sends(s), row);
  }
  for (int d = 0; d < world; ++d) {
    int64_t r = 0;
    for (int s = 0; s < world; ++s) r += plan.count[s * world + d];
    EXPECT_EQ(plan.recvs(d), r);
  }
}

TEST(Ep, PlanErrorsNameTheValue) {
  const std::vector<int32_t> ids = {0, 7};
  ep::Plan plan;
  Status st = ep::make_plan(2, 8, 2, {ids.data(), ids.data()}, {1, 1}, &plan);
  EXPECT_TRUE(st.ok());
  st = ep::make_plan(3, 8, 2, {ids.data(), ids.data(), ids.data()}, {1, 1, 1}, &plan);
  EXPECT_NE(st.message().find("Eg"), std::string::npos) << st.message();
  const std::vector<int32_t> bad = {0, 8};
  st = ep::make_plan(2, 8, 2, {ids.data(), bad.data()}, {1, 1}, &plan);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got 8"), std::string::npos) << st.message();
}

// One EP problem: per-rank token counts and a routing generator; the full weights on the host.
struct Problem {
  int world, Eg, k;
  int64_t H = 64, I = 32;
  std::vector<int64_t> tokens;
  Buffer w1, w2;                                  // all experts
  std::vector<Buffer> x, ids, wts, out;           // per rank
  Problem(int world_, int Eg_, int k_, std::vector<int64_t> t, bool skew, uint64_t seed)
      : world(world_), Eg(Eg_), k(k_), tokens(std::move(t)) {
    Rng rng(seed);
    w1 = Buffer(DType::bf16, {Eg, 2 * I, H});
    w2 = Buffer(DType::bf16, {Eg, H, I});
    rng.fill_normal(w1, 0.1f);
    rng.fill_normal(w2, 0.1f);
    for (int r = 0; r < world; ++r) {
      const int64_t T = tokens[size_t(r)];
      x.emplace_back(DType::bf16, std::initializer_list<int64_t>{T, H});
      rng.fill_normal(x.back(), 1.0f);
      // skew: every token picks only experts of the first half of the ranks (the rest receive nothing).
      const int hi = skew ? Eg / 2 : Eg;
      const auto r_ids = routing(rng, T, k, 0, hi, true);
      ids.emplace_back(DType::i32, std::initializer_list<int64_t>{T, int64_t(k)});
      std::copy(r_ids.begin(), r_ids.end(), ids.back().data<int32_t>());
      wts.emplace_back(DType::f32, std::initializer_list<int64_t>{T, int64_t(k)});
      rng.fill_uniform(wts.back(), 0.1f, 1.0f);
      out.emplace_back(DType::bf16, std::initializer_list<int64_t>{T, H});
      out.back().fill_bytes(0xAB);
    }
  }
  // The experts of rank r: a view into the full weights.
  TensorView w_of(const Buffer& w, int r) const {
    TensorView v = w.view;
    const int64_t e = Eg / world;
    v.shape[0] = e;
    v.data = const_cast<unsigned char*>(w.bytes.data()) + size_t(r * e) * size_t(v.stride[0]) * 2;
    return v;
  }
  // Single-device reference: fused_moe over all tokens of all ranks with all experts (host).
  std::vector<float> single() const {
    int64_t T = 0;
    for (int64_t t : tokens) T += t;
    Buffer ax(DType::bf16, {T, H}), ai(DType::i32, {T, int64_t(k)}), aw(DType::f32, {T, int64_t(k)}),
        ao(DType::bf16, {T, H});
    int64_t at = 0;
    for (int r = 0; r < world; ++r) {
      std::copy(x[size_t(r)].bytes.begin(), x[size_t(r)].bytes.end(), ax.bytes.begin() + at * H * 2);
      std::copy(ids[size_t(r)].bytes.begin(), ids[size_t(r)].bytes.end(), ai.bytes.begin() + at * k * 4);
      std::copy(wts[size_t(r)].bytes.begin(), wts[size_t(r)].bytes.end(), aw.bytes.begin() + at * k * 4);
      at += tokens[size_t(r)];
    }
    FusedMoeParams p;
    p.x = ax.view;
    p.w1 = w1.view;
    p.w2 = w2.view;
    p.topk_ids = ai.view;
    p.topk_weights = aw.view;
    p.out = ao.view;
    EXPECT_TRUE(fused_moe(p).ok());
    std::vector<float> v(static_cast<size_t>(T * H));
    for (int64_t i = 0; i < T * H; ++i) v[size_t(i)] = ao.get(i);
    return v;
  }
  std::vector<ep::RankInputs> host_ranks() {
    std::vector<ep::RankInputs> rs;
    for (int r = 0; r < world; ++r) {
      rs.push_back({x[size_t(r)].view, ids[size_t(r)].view, wts[size_t(r)].view, w_of(w1, r), w_of(w2, r),
                    out[size_t(r)].view});
    }
    return rs;
  }
};

// EP outputs (per rank, concatenated) vs the single-device result: bf16 tolerance (one extra
// rounding of each partial row).
void expect_close(const Problem& pb, const std::vector<std::vector<float>>& got, const std::vector<float>& want) {
  float amax = 0;
  for (float v : want) amax = std::max(amax, std::fabs(v));
  int64_t at = 0;
  for (int r = 0; r < pb.world; ++r) {
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) {
      const float w = want[size_t(at + i)], g = got[size_t(r)][size_t(i)];
      ASSERT_LE(std::fabs(g - w), 1e-2f * amax + 2e-2f * std::fabs(w)) << "rank " << r << " element " << i;
    }
    at += pb.tokens[size_t(r)] * pb.H;
  }
}

void run_simulation(int world, std::vector<int64_t> tokens, bool skew, uint64_t seed) {
  Problem pb(world, 16, 4, std::move(tokens), skew, seed);
  const auto want = pb.single();
  ASSERT_TRUE(ep::simulate_host(pb.host_ranks(), pb.Eg).ok());
  std::vector<std::vector<float>> got;
  for (int r = 0; r < world; ++r) {
    got.emplace_back();
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) got.back().push_back(pb.out[size_t(r)].get(i));
  }
  expect_close(pb, got, want);
}

TEST(Ep, SimulateTwoRanksEqualsSingle) { run_simulation(2, {7, 13}, false, 1); }
TEST(Ep, SimulateFourRanksUnevenWithEmptyRank) { run_simulation(4, {9, 0, 33, 2}, false, 2); }
TEST(Ep, SimulateRanksThatReceiveNothing) { run_simulation(4, {5, 6, 7, 8}, true, 3); }

TEST(Ep, ValidateNamesRankAndArgument) {
  Problem pb(2, 8, 2, {3, 4}, false, 4);
  auto rs = pb.host_ranks();
  Buffer wide(DType::bf16, {4, 96});
  rs[1].x = wide.view;
  const Status st = ep::simulate_host(rs, pb.Eg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 1 x"), std::string::npos) << st.message();
  // Nothing was written.
  for (int r = 0; r < 2; ++r)
    for (unsigned char b : pb.out[size_t(r)].bytes) ASSERT_EQ(b, 0xAB);
}

#ifdef MOEKIT_WITH_CUDA
// The NCCL runner on `world` GPUs vs the single-device (host) result.
void run_nccl(int world, std::vector<int64_t> tokens, bool skew, uint64_t seed) {
  int n = 0;
  if (!ep::nccl_available()) GTEST_SKIP() << "built without the NCCL runner";
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < world) GTEST_SKIP() << "needs " << world << " GPUs, has " << n;
  Problem pb(world, 16, 4, std::move(tokens), skew, seed);
  const auto want = pb.single();
  std::vector<int> devs;
  for (int r = 0; r < world; ++r) devs.push_back(r);
  std::unique_ptr<ep::Group> group;
  ASSERT_TRUE(ep::create_group(devs, &group).ok());
  std::vector<void*> allocs;
  auto up = [&](const TensorView& h, int dev) {
    TensorView d = h;
    cudaSetDevice(dev);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(size_t(h.nbytes()), 16)), cudaSuccess);
    if (h.nbytes() > 0) cudaMemcpy(p, h.data, size_t(h.nbytes()), cudaMemcpyHostToDevice);
    allocs.push_back(p);
    d.data = p;
    d.device = Device::cuda;
    d.device_index = dev;
    return d;
  };
  auto hr = pb.host_ranks();
  std::vector<ep::RankInputs> dr;
  for (int r = 0; r < world; ++r) {
    dr.push_back({up(hr[r].x, r), up(hr[r].topk_ids, r), up(hr[r].topk_weights, r), up(hr[r].w1, r), up(hr[r].w2, r),
                  up(hr[r].out, r)});
  }
  ep::PhaseTimes times;
  const Status st = ep::run(*group, dr, pb.Eg, {}, &times);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<std::vector<float>> got;
  for (int r = 0; r < world; ++r) {
    cudaSetDevice(r);
    cudaMemcpy(hr[r].out.data, dr[size_t(r)].out.data, size_t(hr[r].out.nbytes()), cudaMemcpyDeviceToHost);
    got.emplace_back();
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) got.back().push_back(pb.out[size_t(r)].get(i));
  }
  for (void* p : allocs) cudaFree(p);
  expect_close(pb, got, want);
}

TEST(Ep, NcclTwoRanksEqualsSingle) { run_nccl(2, {64, 17}, false, 5); }
TEST(Ep, NcclTwoRanksOneEmpty) { run_nccl(2, {0, 40}, false, 6); }
TEST(Ep, NcclFourRanksUneven) { run_nccl(4, {100, 0, 7, 300}, false, 7); }
TEST(Ep, NcclFourRanksReceiveNothing) { run_nccl(4, {30, 20, 10, 5}, true, 8); }
#endif

}  // namespace
}  // namespace moekit
