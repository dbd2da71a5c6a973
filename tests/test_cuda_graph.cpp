// CUDA-graph safety of every CUDA fused_moe and sort_tokens kernel: the op is captured once into a
// graph on a non-default stream, replayed, then the INPUT CONTENTS change in place (new x, new
// routing, new weights of the same shapes) and the same graph is replayed again; each replay must
// match the reference kernel on the data it saw. A kernel that synchronises, allocates or bakes
// data-dependent sizes into its launches fails here. Skipped when no CUDA device is available.
// Built only with the CUDA backend (tests/CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moekit/ops/fused_moe.h"
#include "moekit/ops/routing.h"
#include "moekit/ops/sorting.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit {
namespace {

using testing::MoeProblem;
using testing::MoeShape;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

std::vector<const Kernel*> cuda_kernels(OpKind op, MoeVariant v) {
  std::vector<const Kernel*> out;
  for (const Kernel* k : registry().candidates(op, v)) {
    if (k->backend == Backend::cuda) out.push_back(k);
  }
  return out;
}

MoeProblem make(int64_t T, uint64_t seed) {
  MoeShape s;
  s.T = T;
  s.E = 16;
  s.k = 4;
  s.H = 256;
  s.I = 128;
  MoeProblem p;
  EXPECT_TRUE(testing::make_moe_problem(s, {}, seed, &p).ok());
  return p;
}

// The reference output of a host problem.
std::vector<double> ref_out(MoeProblem& p) {
  RunOptions o;
  o.kernel = "fused_moe_ref";
  EXPECT_TRUE(fused_moe(p.params(), o).ok());
  return testing::read_out(p.params().out);
}

// Copies every input buffer of host problem `src` into the device views of `dev`.
void upload(MoeProblem& src, const FusedMoeParams& dev) {
  const FusedMoeParams h = src.params();
  const DeviceOps* ops = registry().device_ops(Backend::cuda);
  for (auto [d, s] : {std::pair{dev.x, h.x}, {dev.w1, h.w1}, {dev.w2, h.w2}, {dev.topk_ids, h.topk_ids},
                      {dev.topk_weights, h.topk_weights}}) {
    ASSERT_TRUE(ops->copy_to_device(d.data, s.data, testing::extent_bytes(s)).ok());
  }
}

TEST(CudaGraph, FusedMoeReplayWithChangedInputs) {
  if (!registry().backend_available(Backend::cuda).ok()) GTEST_SKIP() << "no CUDA device";
  const std::vector<const Kernel*> kernels = cuda_kernels(OpKind::fused_moe, MoeVariant::unquantized);
  if (kernels.empty()) GTEST_SKIP() << "no CUDA fused_moe kernel registered";
  for (int64_t T : {3, 200}) {
    for (const Kernel* k : kernels) {
      SCOPED_TRACE(std::string(k->name) + " T=" + std::to_string(T));
      MoeProblem a = make(T, 11), b = make(T, 12);
      const std::vector<double> want_a = ref_out(a), want_b = ref_out(b);
      MoeProblem host = a;  // its buffers receive the device outputs
      testing::DeviceMirror m(Backend::cuda);
      FusedMoeParams p = host.params();
      for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights}) ASSERT_TRUE(m.input(t).ok());
      ASSERT_TRUE(m.output(&p.out).ok());
      RunOptions o;
      o.kernel = k->name;
      size_t ws = 0;
      ASSERT_TRUE(fused_moe_workspace_size(p, o, &ws).ok());
      ASSERT_TRUE(m.scratch(ws, &o.workspace).ok());
      o.workspace_bytes = ws;
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      o.stream = stream;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const Status st = fused_moe(p, o);
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_TRUE(st.ok()) << st.to_string();
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

      for (int round = 0; round < 2; ++round) {
        MoeProblem& src = round == 0 ? a : b;
        upload(src, p);
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        ASSERT_TRUE(m.copy_back().ok());
        testing::Metrics met;
        std::string detail;
        const testing::MoeTolerance& tol =
            testing::moe_tolerance(MoeVariant::unquantized, src.x_dtype, testing::MoeCompare::kernel_vs_ref);
        EXPECT_TRUE(testing::judge_moe(testing::read_out(host.params().out), round == 0 ? want_a : want_b, T,
                                       src.shape.H, tol, &met, &detail))
            << "replay " << round << ": " << detail << " worst " << met.worst;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  }
}

// Routing then sorting, captured together (the stage in front of the fused kernels): topk_softmax
// over new logits and sort_tokens of its ids, replayed with the logits changed in place; both
// outputs must equal the reference kernels' on the data of each replay.
TEST(CudaGraph, RoutingAndSortingReplayWithChangedInputs) {
  if (!registry().backend_available(Backend::cuda).ok()) GTEST_SKIP() << "no CUDA device";
  if (registry().find("topk_softmax_sm90") == nullptr || registry().find("sort_tokens_sm90") == nullptr) {
    GTEST_SKIP() << "CUDA routing / sorting kernels not registered";
  }
  const int64_t T = 300, E = 64, k = 6, block_m = 16;
  const int64_t P = sort_tokens_max_padded(T, k, E, block_m), B = sort_tokens_max_blocks(T, k, E, block_m);
  using testing::Buffer;
  Buffer logits(DType::bf16, {T, E}), w(DType::f32, {T, k}), ids(DType::i32, {T, k});
  Buffer sid(DType::i32, {P}), sw(DType::f32, {P}), seid(DType::i32, {B}), nv(DType::i32, {1});
  // Host reference of both ops for one set of logits: the integer outputs concatenated (compared
  // exactly) and the sorted weights (compared within the routing tolerance: the device softmax may
  // differ from the host's by an ulp).
  struct Ref {
    std::vector<unsigned char> ints;
    std::vector<double> weights;
  };
  auto reference = [&](const Buffer& lg) {
    Buffer rw = w, rid = ids, a = sid, b = sw, c = seid, d = nv;
    TopkSoftmaxParams tp;
    tp.gating = lg.view;
    tp.k = int(k);
    tp.renormalize = true;
    tp.topk_weights = rw.view;
    tp.topk_ids = rid.view;
    RunOptions o;
    o.kernel = "topk_softmax_ref";
    EXPECT_TRUE(topk_softmax(tp, o).ok());
    SortTokensParams sp;
    sp.topk_ids = rid.view;
    sp.topk_weights = rw.view;
    sp.num_experts = int(E);
    sp.block_m = int(block_m);
    sp.sorted_token_ids = a.view;
    sp.sorted_weights = b.view;
    sp.sorted_expert_ids = c.view;
    sp.num_valid = d.view;
    o.kernel = "sort_tokens_ref";
    EXPECT_TRUE(sort_tokens(sp, o).ok());
    Ref r;
    r.ints = rid.bytes;
    for (const Buffer* x : {&a, &c, &d}) r.ints.insert(r.ints.end(), x->bytes.begin(), x->bytes.end());
    r.weights = testing::to_doubles(b.view);
    return r;
  };
  testing::Rng rng(5);
  Buffer la = logits, lb = logits;
  rng.fill_normal(la, 2.0f);
  rng.fill_normal(lb, 2.0f);
  const Ref want_a = reference(la), want_b = reference(lb);

  testing::DeviceMirror m(Backend::cuda);
  TopkSoftmaxParams tp;
  tp.gating = logits.view;
  tp.k = int(k);
  tp.renormalize = true;
  tp.topk_weights = w.view;
  tp.topk_ids = ids.view;
  ASSERT_TRUE(m.input(&tp.gating).ok());
  ASSERT_TRUE(m.output(&tp.topk_weights).ok());
  ASSERT_TRUE(m.output(&tp.topk_ids).ok());
  SortTokensParams sp;
  sp.topk_ids = tp.topk_ids;  // device views: the sort reads what the router wrote
  sp.topk_weights = tp.topk_weights;
  sp.num_experts = int(E);
  sp.block_m = int(block_m);
  sp.sorted_token_ids = sid.view;
  sp.sorted_weights = sw.view;
  sp.sorted_expert_ids = seid.view;
  sp.num_valid = nv.view;
  for (TensorView* t : {&sp.sorted_token_ids, &sp.sorted_weights, &sp.sorted_expert_ids, &sp.num_valid}) {
    ASSERT_TRUE(m.output(t).ok());
  }
  RunOptions ro, so;
  ro.kernel = "topk_softmax_sm90";
  so.kernel = "sort_tokens_sm90";
  size_t ws = 0;
  ASSERT_TRUE(sort_tokens_workspace_size(sp, so, &ws).ok());
  ASSERT_TRUE(m.scratch(ws, &so.workspace).ok());
  so.workspace_bytes = ws;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ro.stream = so.stream = stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status s1 = topk_softmax(tp, ro);
  const Status s2 = sort_tokens(sp, so);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(s1.ok()) << s1.to_string();
  ASSERT_TRUE(s2.ok()) << s2.to_string();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  const DeviceOps* ops = registry().device_ops(Backend::cuda);
  for (int round = 0; round < 2; ++round) {
    const Buffer& src = round == 0 ? la : lb;
    ASSERT_TRUE(ops->copy_to_device(tp.gating.data, src.bytes.data(), size_t(src.view.nbytes())).ok());
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_TRUE(m.copy_back().ok());
    const Ref& want = round == 0 ? want_a : want_b;
    std::vector<unsigned char> got = ids.bytes;
    for (const Buffer* x : {&sid, &seid, &nv}) got.insert(got.end(), x->bytes.begin(), x->bytes.end());
    EXPECT_EQ(got, want.ints) << "replay " << round << ": ids or sorted ids / blocks / num_valid differ";
    const testing::Metrics met = testing::compare_close(testing::to_doubles(sw.view), want.weights, 1e-6, 1e-5);
    EXPECT_EQ(met.mismatches, 0) << "replay " << round << ": sorted weights, worst " << met.worst;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit
