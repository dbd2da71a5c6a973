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

// fp8 per-row weights of w ([E, N, K] bf16): codes e4m3fn(v / s) with s = amax(row) / 448.
void quantize_rows(const Buffer& w, Buffer* q, Buffer* scale) {
  const int64_t E = w.view.shape[0], N = w.view.shape[1], K = w.view.shape[2];
  *q = Buffer(DType::fp8_e4m3fn, {E, N, K});
  *scale = Buffer(DType::f32, {E, N});
  for (int64_t r = 0; r < E * N; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < K; ++c) amax = std::max(amax, std::fabs(w.get(r * K + c)));
    const float sc = amax > 0 ? amax / 448.0f : 1.0f;
    scale->set(r, sc);
    for (int64_t c = 0; c < K; ++c) q->set(r * K + c, w.get(r * K + c) / sc);
  }
}

// One EP problem: per-rank token counts and a routing generator; the full weights on the host
// (bf16, or fp8 per-row codes + scales when fp8_weights).
struct Problem {
  int world, Eg, k;
  int64_t H = 64, I = 32;
  std::vector<int64_t> tokens;
  bool fp8_weights = false;
  Buffer w1, w2, w1s, w2s;                        // all experts (w1s / w2s: fp8 only)
  std::vector<Buffer> x, ids, wts, out;           // per rank
  Problem(int world_, int Eg_, int k_, std::vector<int64_t> t, bool skew, uint64_t seed, bool fp8 = false)
      : world(world_), Eg(Eg_), k(k_), tokens(std::move(t)), fp8_weights(fp8) {
    Rng rng(seed);
    w1 = Buffer(DType::bf16, {Eg, 2 * I, H});
    w2 = Buffer(DType::bf16, {Eg, H, I});
    rng.fill_normal(w1, 0.1f);
    rng.fill_normal(w2, 0.1f);
    if (fp8_weights) {
      Buffer q1, q2;
      quantize_rows(w1, &q1, &w1s);
      quantize_rows(w2, &q2, &w2s);
      w1 = std::move(q1);
      w2 = std::move(q2);
    }
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
    if (w.bytes.empty()) return TensorView{};
    TensorView v = w.view;
    const int64_t e = Eg / world;
    v.shape[0] = e;
    v.data = const_cast<unsigned char*>(w.bytes.data()) + size_t(r * e) * size_t(v.stride[0]) * dtype_size(v.dtype);
    return v;
  }
  bool weight_on_input = false;  // Llama-4 style (k == 1)
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
    if (fp8_weights) {
      p.w1_scale = w1s.view;
      p.w2_scale = w2s.view;
    }
    p.topk_ids = ai.view;
    p.topk_weights = aw.view;
    p.out = ao.view;
    p.weight_on_input = weight_on_input;
    EXPECT_TRUE(fused_moe(p).ok());
    std::vector<float> v(static_cast<size_t>(T * H));
    for (int64_t i = 0; i < T * H; ++i) v[size_t(i)] = ao.get(i);
    return v;
  }
  std::vector<ep::RankInputs> host_ranks() {
    std::vector<ep::RankInputs> rs;
    for (int r = 0; r < world; ++r) {
      ep::RankInputs q;
      q.x = x[size_t(r)].view;
      q.topk_ids = ids[size_t(r)].view;
      q.topk_weights = wts[size_t(r)].view;
      q.w1 = w_of(w1, r);
      q.w2 = w_of(w2, r);
      q.out = out[size_t(r)].view;
      q.w1_scale = w_of(w1s, r);
      q.w2_scale = w_of(w2s, r);
      rs.push_back(q);
    }
    return rs;
  }
};

// EP outputs (per rank, concatenated) vs the single-device result: bf16 tolerance (one extra
// rounding of each partial row); with fp8_dispatch the relative RMS error instead (x rows pass
// through e4m3fn: ~2^-4 relative per element, averaged over H in the GEMMs).
void expect_close(const Problem& pb, const std::vector<std::vector<float>>& got, const std::vector<float>& want,
                  bool fp8_dispatch = false) {
  if (fp8_dispatch) {
    double num = 0, den = 0;
    int64_t at = 0;
    for (int r = 0; r < pb.world; ++r) {
      for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) {
        const double w = want[size_t(at + i)], g = got[size_t(r)][size_t(i)];
        ASSERT_TRUE(std::isfinite(g)) << "rank " << r << " element " << i;
        num += (g - w) * (g - w);
        den += w * w;
      }
      at += pb.tokens[size_t(r)] * pb.H;
    }
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 0.05);
    return;
  }
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

void run_simulation(int world, std::vector<int64_t> tokens, bool skew, uint64_t seed, bool fp8_weights = false,
                    bool fp8_dispatch = false) {
  Problem pb(world, 16, 4, std::move(tokens), skew, seed, fp8_weights);
  const auto want = pb.single();
  ep::Options o;
  o.fp8_dispatch = fp8_dispatch;
  const Status st = ep::simulate_host(pb.host_ranks(), pb.Eg, o);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<std::vector<float>> got;
  for (int r = 0; r < world; ++r) {
    got.emplace_back();
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) got.back().push_back(pb.out[size_t(r)].get(i));
  }
  expect_close(pb, got, want, fp8_dispatch);
}

TEST(Ep, SimulateTwoRanksEqualsSingle) { run_simulation(2, {7, 13}, false, 1); }

// One rank: the plan sends every routed token to itself; the result is the single-device one.
TEST(Ep, SimulateOneRankEqualsSingle) { run_simulation(1, {11}, false, 12); }

// Llama-4 style: k = 1 with the router weight on the expert input, over 4 ranks.
TEST(Ep, SimulateWeightOnInputKOne) {
  Problem pb(4, 16, 1, {6, 9, 0, 5}, false, 13);
  pb.weight_on_input = true;
  const auto want = pb.single();
  ep::Options o;
  o.weight_on_input = true;
  ASSERT_TRUE(ep::simulate_host(pb.host_ranks(), pb.Eg, o).ok());
  std::vector<std::vector<float>> got;
  for (int r = 0; r < pb.world; ++r) {
    got.emplace_back();
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) got.back().push_back(pb.out[size_t(r)].get(i));
  }
  expect_close(pb, got, want);
}
TEST(Ep, SimulateFp8PerRowWeightsFourRanks) { run_simulation(4, {9, 0, 21, 4}, false, 9, /*fp8_weights=*/true); }
TEST(Ep, SimulateFp8Dispatch) { run_simulation(2, {12, 30}, false, 10, false, /*fp8_dispatch=*/true); }
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
void run_nccl(int world, std::vector<int64_t> tokens, bool skew, uint64_t seed, bool fp8_dispatch = false) {
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
    if (!h.present()) return h;
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
    ep::RankInputs q;
    q.x = up(hr[r].x, r);
    q.topk_ids = up(hr[r].topk_ids, r);
    q.topk_weights = up(hr[r].topk_weights, r);
    q.w1 = up(hr[r].w1, r);
    q.w2 = up(hr[r].w2, r);
    q.out = up(hr[r].out, r);
    dr.push_back(q);
  }
  ep::PhaseTimes times;
  ep::Options o;
  o.fp8_dispatch = fp8_dispatch;
  const Status st = ep::run(*group, dr, pb.Eg, o, &times);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<std::vector<float>> got;
  for (int r = 0; r < world; ++r) {
    cudaSetDevice(r);
    cudaMemcpy(hr[r].out.data, dr[size_t(r)].out.data, size_t(hr[r].out.nbytes()), cudaMemcpyDeviceToHost);
    got.emplace_back();
    for (int64_t i = 0; i < pb.tokens[size_t(r)] * pb.H; ++i) got.back().push_back(pb.out[size_t(r)].get(i));
  }
  for (void* p : allocs) cudaFree(p);
  expect_close(pb, got, want, fp8_dispatch);
}

TEST(Ep, NcclTwoRanksEqualsSingle) { run_nccl(2, {64, 17}, false, 5); }
TEST(Ep, NcclTwoRanksOneEmpty) { run_nccl(2, {0, 40}, false, 6); }
TEST(Ep, NcclFourRanksUneven) { run_nccl(4, {100, 0, 7, 300}, false, 7); }
TEST(Ep, NcclFourRanksReceiveNothing) { run_nccl(4, {30, 20, 10, 5}, true, 8); }
TEST(Ep, NcclTwoRanksFp8Dispatch) { run_nccl(2, {50, 21}, false, 11, /*fp8_dispatch=*/true); }
#endif

}  // namespace
}  // namespace moekit
