// Device timing by CUDA-graph replay: DeviceOps::time_graph (contract in moekit/registry.h, method
// in docs/cli.md "How CUDA rows are measured"). Used by `moekit bench` for every CUDA row and by the
// unfused cuBLAS baseline (moe_baseline_cublas.cu). Covered on the GPU by
// tests/test_moe_baseline_cublas.cpp (MoeBaselineCublas.TimeGraph*).
//
// Per call: one non-blocking stream; launch(stream, s) run eagerly once per set and synchronised
// (first-use initialisation such as module loading or cuBLAS heuristics happens outside capture,
// and a kernel error is reported as such, not as a capture failure); one graph per set captured in
// cudaStreamCaptureModeThreadLocal; warm-up replays; then every sample enqueued back to back:
//   [memset of the flush buffer  [read of the second buffer]]  event start  graph replay  event stop
// with one pair of events per sample and a single synchronisation at the end, so the host never
// waits between samples and the launch latency of the replay is hidden behind the flush (the GPU
// queue stays full). Sample = cudaEventElapsedTime(start, stop).
//
// NOTE: the flush buffer is max(2 x L2, 128 MiB) written with cudaMemsetAsync, a different byte
// value each sample. A write of twice the L2 capacity evicts every line the previous replay left
// (Hopper's L2 is not inclusive of anything the next replay reads), which is what the peer's
// harness does (ANCHORS.md: "L2 flushed before each run").
// NOTE: the memset leaves the L2 full of dirty lines, which the timed replay then writes back to DRAM
// as its reads evict them: a few us per replay against a flush that leaves clean lines
// (docs/experiments.md E1). Kept as is: the peer's numbers in ANCHORS.md were taken the same way.
// L2Flush::clean (`moekit bench --l2 clean`) adds a read of a second buffer after the memset
// (read_all_kernel), outside the timed region (E2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/cuda_timing.h"
#include "cuda/cuda_utils.h"

namespace moekit::cuda {

namespace {

// L2Flush::clean: reads n int4 of p (grid-stride), so the L2 holds clean lines of p; the XOR of the
// values goes to *sink only if it equals an unlikely constant (the loads cannot be dropped).
__global__ void read_all_kernel(const int4* p, size_t n, int* sink) {
  int x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x7f123456) *sink = x;
}
constexpr unsigned kReadAllBlocks = 528, kReadAllThreads = 512;

constexpr size_t kMinFlushBytes = size_t(128) << 20;

// Owns everything one time_graph call creates; the destructor releases it on every path.
struct TimingResources {
  cudaStream_t stream = nullptr;
  void* flush = nullptr;
  void* flush2 = nullptr;  // L2Flush::clean: the buffer read after the memset (+ 16 bytes: the sink)
  std::vector<cudaGraph_t> graphs;
  std::vector<cudaGraphExec_t> execs;
  std::vector<cudaEvent_t> events;
  ~TimingResources() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    // Only what was created: a capture that failed leaves null entries (destroying one is an API error).
    for (cudaGraphExec_t x : execs) if (x != nullptr) cudaGraphExecDestroy(x);
    for (cudaGraph_t g : graphs) if (g != nullptr) cudaGraphDestroy(g);
    if (flush != nullptr) cudaFree(flush);
    if (flush2 != nullptr) cudaFree(flush2);
    if (stream != nullptr) cudaStreamDestroy(stream);
    // NOTE: a failed capture (an op that synchronises) leaves a non-sticky error behind; clear it
    // so it is not reported by the next, unrelated launch check. The failure itself was returned.
    cudaGetLastError();
  }
};

size_t flush_bytes() {
  int dev = 0, l2 = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    cudaGetLastError();
    return kMinFlushBytes;
  }
  return std::max(kMinFlushBytes, 2 * size_t(l2));
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

Status time_graph(const std::function<Status(void* stream, int set)>& launch, int sets, int warmup, int iters,
                  L2Flush flush, const char* what, std::vector<double>* us) {
  const char* name = what != nullptr ? what : "device op";
  if (sets < 1) return InvalidArgument("time_graph (", name, "): sets must be >= 1, got ", sets);
  if (iters < 1) return InvalidArgument("time_graph (", name, "): iters must be >= 1, got ", iters);
  if (warmup < 0) return InvalidArgument("time_graph (", name, "): warmup must be >= 0, got ", warmup);
  if (us == nullptr) return InvalidArgument("time_graph (", name, "): us must not be null");
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGetLastError(), "time_graph: an earlier CUDA error is pending"));

  TimingResources r;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  const bool flush_l2 = flush != L2Flush::none;
  const size_t fbytes = flush_l2 ? flush_bytes() : 0;
  if (flush_l2) MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(&r.flush, fbytes), "cudaMalloc (L2 flush buffer)"));
  if (flush == L2Flush::clean) {
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(&r.flush2, fbytes + 16), "cudaMalloc (L2 clean-flush buffer)"));
    MOEKIT_RETURN_IF_ERROR(
        check_cuda(cudaMemsetAsync(r.flush2, 0, fbytes + 16, r.stream), "cudaMemsetAsync (L2 clean-flush buffer)"));
  }

  // Eager run of every set: the op's own errors, and one-time initialisation, before capture.
  for (int s = 0; s < sets; ++s) {
    const Status st = launch(r.stream, s);
    if (!st.ok()) return BackendError(name, ": eager run of input set ", s, " failed: ", st.to_string());
    const Status sync = check_cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize after the eager run");
    if (!sync.ok()) return BackendError(name, ": input set ", s, ": ", sync.message());
  }

  // Capture one graph per set.
  r.graphs.assign(size_t(sets), nullptr);
  r.execs.assign(size_t(sets), nullptr);
  for (int s = 0; s < sets; ++s) {
    MOEKIT_RETURN_IF_ERROR(
        check_cuda(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
    const Status st = launch(r.stream, s);
    const cudaError_t end = cudaStreamEndCapture(r.stream, &r.graphs[size_t(s)]);
    const cudaError_t pending = cudaGetLastError();  // clears a launch error recorded during capture
    if (!st.ok() || end != cudaSuccess || pending != cudaSuccess) {
      const cudaError_t e = end != cudaSuccess ? end : pending;
      return BackendError(name, ": CUDA-graph capture of input set ", s, " failed (",
                          st.ok() ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e) : st.to_string(),
                          "); a kernel that synchronises, allocates, or launches on a stream other than the one "
                          "it was given cannot be captured");
    }
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGraphInstantiate(&r.execs[size_t(s)], r.graphs[size_t(s)], 0),
                                      "cudaGraphInstantiate"));
  }

  // Warm-up replays (not timed).
  for (int w = 0; w < warmup; ++w) {
    for (int s = 0; s < sets; ++s) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGraphLaunch(r.execs[size_t(s)], r.stream), "cudaGraphLaunch (warm-up)"));
    }
  }
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize after warm-up"));

  // Samples: everything enqueued back to back, one event pair per sample, one sync at the end.
  r.events.assign(size_t(2 * iters), nullptr);
  for (cudaEvent_t& e : r.events) MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventCreate(&e), "cudaEventCreate"));
  for (int i = 0; i < iters; ++i) {
    if (flush_l2) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemsetAsync(r.flush, i & 0xFF, fbytes, r.stream), "cudaMemsetAsync (L2 flush)"));
      if (flush == L2Flush::clean) {
        read_all_kernel<<<kReadAllBlocks, kReadAllThreads, 0, r.stream>>>(
            static_cast<const int4*>(r.flush2), fbytes / 16, reinterpret_cast<int*>(static_cast<char*>(r.flush2) + fbytes));
        MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGetLastError(), "read_all_kernel (L2 clean flush)"));
      }
    }
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(r.events[size_t(2 * i)], r.stream), "cudaEventRecord"));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGraphLaunch(r.execs[size_t(i % sets)], r.stream), "cudaGraphLaunch"));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(r.events[size_t(2 * i + 1)], r.stream), "cudaEventRecord"));
  }
  const Status done = check_cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize after the timed replays");
  if (!done.ok()) return BackendError(name, ": ", done.message());
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    MOEKIT_RETURN_IF_ERROR(
        check_cuda(cudaEventElapsedTime(&ms, r.events[size_t(2 * i)], r.events[size_t(2 * i + 1)]), "cudaEventElapsedTime"));
    us->push_back(double(ms) * 1e3);
  }
  return Status::Ok();
}

}  // namespace moekit::cuda
