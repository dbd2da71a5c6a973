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

}  // namespace
}  // namespace moekit
