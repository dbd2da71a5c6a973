// The D0 microbenchmarks of docs/design/fused_moe_decode.md (section 5, step D0; sections 2.1-2.7
// and 4): the primitives a one-launch cooperative decode kernel is built from, each timed alone on
// this GPU before anything is built on them. Tests (`--only N` runs one; no argument runs all):
//   1 launch cost: graphs of an empty kernel on G = SM-count CTAs, launched normally and
//     cooperatively (cudaLaunchKernelEx + cudaLaunchAttributeCooperative, captured into the graph;
//     a failed capture is reported), cooperative kernels with 1 and 3 grid syncs (per-sync cost),
//     an empty graph and a graph of only the L2-flush memset (2.1, 2.6, risk 1).
//   2 weight stream: a persistent kernel streams a contiguous fp8 buffer (9.4 / 38 / 352 MB, rows of
//     4096 codes) through a TMA ring of S = 4 / 8 / 12 stages of 8 KB (a 64 x 128-byte box, 128-byte
//     swizzle; also eight 8-row boxes per stage, risk 4) or with 16-byte ld.global.nc loads (1 or 2
//     rows per warp at a time); us, TB/s, and a line time = ramp + bytes / rate fitted over the
//     three sizes (2.7, 2.10).
//   3 wgmma m64n8k32 e4m3 issue rate (1 and 2 warpgroups per CTA, with and without the per-slice
//     promotion of fp8_block) against the 4.3 TB/s / SM-count each SM must consume (2.3, risk 4).
//   4 flag handoff between two CTAs on different SMs: release (fence.acq_rel.gpu +
//     red.release.gpu) / acquire spin (ld.acquire.gpu), with and without __nanosleep backoff (2.6).
//   5 x staging: every CTA reads T x H bf16, takes per-token amax and writes e4m3 codes into shared
//     memory in the wgmma B layout (risk 3).
// Timing: each case is captured once into a CUDA graph and replayed (--reps, default 50), one
// cudaEvent pair per replay; median and min. Flush modes: "graph" = a cudaMemsetAsync of a
// 2 x L2-size buffer inside the graph before the kernel (the memset-only graph is reported too, and
// "net" = time - that); "harness" = the memset outside the graph before the start event, as
// src/cuda/cuda_timing.cu; "none" = no flush. Replays other than "harness" follow a 30 us spin kernel
// outside the timed region, so the host's graph-launch latency is not timed. Output: human-readable
// lines, then a CSV block (test,param,us_median,us_min,derived). Not built by CMake; on a GPU machine
// from the repository root (--expt-relaxed-constexpr as CMakeLists.txt, for wgmma_desc.h; no -lcuda:
// cuTensorMapEncodeTiled comes through the runtime, as in cuda/tensor_map.h; scripts/gpu_d0.sh):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -I include tools/decode_d0_probe.cu -o /tmp/d0
//   /tmp/d0 [--only N] [--reps R]
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/sm90/mbarrier.cuh"
#include "cuda/sm90/ring.cuh"
#include "cuda/sm90/smem.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_desc.h"

#define CK(call)                                                                                            \
  do {                                                                                                      \
    const cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess)                                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)), std::exit(1); \
  } while (0)

namespace cg = cooperative_groups;
using namespace moekit::cuda::sm90;

namespace {

constexpr double kAnchorTBs = 4.3;     // the H200 read ceiling of ANCHORS.md (TB/s)
constexpr int kK = 4096;               // codes per row of the streamed weight matrix (Mixtral's H)
constexpr int kSlice = 128;            // codes (bytes) per slice and row
constexpr uint32_t kStageBytes = 8192; // one 64 x 128-code slice
constexpr int kConsumerWarps = 4;      // stream test: 1 producer warp + 4 consumer warps
constexpr unsigned kPadNs = 30000;     // the spin kernel before each timed replay

// ------------------------------------------------------------------ device helpers and kernels
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void k_pad(unsigned ns) {
  for (const uint64_t t0 = globaltimer(); globaltimer() - t0 < ns;) continue;
}
__global__ void k_empty() {}
template <int NS>
__global__ void k_gridsync() {
  cg::grid_group g = cg::this_grid();
  for (int i = 0; i < NS; ++i) g.sync();
}

// Test 2, TMA: CTA c streams slices [c n / G, (c + 1) n / G) of a [rows, kK] code matrix, slice q =
// 64-row tile q / (kK / 128), columns 128 (q % (kK / 128)) .. +127. Warp 0 lane 0 produces into the
// ring (64 / BOX_ROWS boxes per stage); each consumer warp waits for the stage, lane 0 reads one byte,
// and releases it (empty: one arrive per consumer warp).
template <int S, int BOX_ROWS>
__global__ void __launch_bounds__(32 * (1 + kConsumerWarps))
    k_stream_tma(const __grid_constant__ CUtensorMap map, long long slices, unsigned* sink) {
  using Sm = WsSmemT<S, kStageBytes, kStageBytes>;
  extern __shared__ unsigned char smem_raw[];
  const unsigned char* stages = static_cast<unsigned char*>(align_smem_1024(smem_raw));
  const Sm sm{smem_addr(stages)};
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    ws_init_barriers<kConsumerWarps>(sm);
    tma_prefetch_desc(&map);
  }
  __syncthreads();
  const long long q0 = slices * blockIdx.x / gridDim.x, q1 = slices * (blockIdx.x + 1) / gridDim.x;
  constexpr int kSlicesPerTile = kK / kSlice;
  WsRingT<S> ring;
  if (warp == 0) {
    if (lane == 0) {
      for (long long q = q0; q < q1; ++q) {
        mbar_wait(sm.empty(ring.s), ring.phase ^ 1u);
        const uint32_t full = sm.full(ring.s);
        mbar_arrive_expect_tx(full, kStageBytes);
        const int c0 = int(q % kSlicesPerTile) * kSlice, r0 = int(q / kSlicesPerTile) * 64;
#pragma unroll
        for (int b = 0; b < 64 / BOX_ROWS; ++b)
          tma_load_2d(sm.a(ring.s) + b * BOX_ROWS * 128, &map, c0, r0 + b * BOX_ROWS, full);
        ring.next();
      }
    }
    return;  // no CTA barrier follows; the consumers' waits cover every TMA in flight
  }
  unsigned acc = 0;
  for (long long q = q0; q < q1; ++q) {
    mbar_wait(sm.full(ring.s), ring.phase);
    if (lane == 0) acc += stages[ring.s * kStageBytes + warp * 64];
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.empty(ring.s));
    ring.next();
  }
  if (lane == 0) sink[blockIdx.x * kConsumerWarps + warp - 1] = acc;
}

// Test 2, loads: CTA c takes rows [c R / G, (c + 1) R / G); a warp takes RP rows at a time, each lane
// 4 16-byte loads per row in flight (small_m's load_stream, kUnroll = 4), XOR-summed into a register.
__device__ __forceinline__ uint4 load_nc(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"  // not volatile: ptxas may batch them
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
// (256, 1): with the default bounds ptxas kept 32 registers and issued the RP = 2 loads 1-2 at a time.
template <int RP>
__global__ void __launch_bounds__(256, 1) k_stream_ld(const uint4* w, int rows, unsigned* sink) {
  constexpr int kVec = kK / 16;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, nw = int(blockDim.x) / 32;
  const int r0 = int(1LL * rows * blockIdx.x / gridDim.x), r1 = int(1LL * rows * (blockIdx.x + 1) / gridDim.x);
  unsigned x = 0;
  static_assert(kVec % 128 == 0, "whole batches of 4 x 32 vectors per row");
  for (int r = r0 + warp * RP; r < r1; r += nw * RP) {
    for (int c0 = lane; c0 < kVec; c0 += 32 * 4) {
      uint4 v[RP][4];  // unconditional loads (a tail row re-reads row r1 - 1, not counted), then the XORs
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int i = 0; i < RP; ++i) v[i][u] = load_nc(w + size_t(min(r + i, r1 - 1)) * kVec + c0 + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int i = 0; i < RP; ++i)
          if (r + i < r1) x ^= v[i][u].x ^ v[i][u].y ^ v[i][u].z ^ v[i][u].w;
    }
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

// Test 3: wgmma m64n8k32 e4m3 (sm90::wgmma_fp8_n8: A 64 x 32 and B 8 x 32 codes, K-major, 128-byte
// swizzle).
// Finite e4m3 codes (|v| <= 1.875, both signs).
__device__ __forceinline__ unsigned char test_code(int i) {
  return (unsigned char)(((i * 29 + 7) & 0x3F) | ((i & 1) << 7));
}

constexpr int kATiles = 4;  // A tiles (8 KB each) the slices cycle through
constexpr int kWgmmaSmem = 1024 + kATiles * 8192 + 1024 + 64 * 4;
// Per slice (128 codes): fence, 4 wgmma (k32 steps: +32 bytes = +2 in the descriptor), commit,
// wait_group 0. PROMOTE: each slice starts from zero and is folded into p with a per-slice scale
// (fp8_block's promotion, 2.4).
template <int NWG, bool PROMOTE>
__global__ void __launch_bounds__(NWG * 128) k_wgmma(int iters, float* out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = static_cast<unsigned char*>(align_smem_1024(smem_raw));
  unsigned char* b_tile = base + kATiles * 8192;
  float* scales = reinterpret_cast<float*>(b_tile + 1024);
  for (int i = int(threadIdx.x); i < kATiles * 8192 + 1024; i += int(blockDim.x)) base[i] = test_code(i);
  if (threadIdx.x < 64) scales[threadIdx.x] = 1.0f + float(threadIdx.x) / 64.0f;
  fence_proxy_async_smem();
  __syncthreads();
  const int wg = int(threadIdx.x) / 128;
  const uint32_t a0 = smem_addr(base);
  const uint64_t db = wgmma_desc_sw128(smem_addr(b_tile));
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < iters; ++i) {
    const uint64_t da = wgmma_desc_sw128(a0 + uint32_t((i + wg) & (kATiles - 1)) * 8192u);
    fence_regs(d);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n8(d, da + uint64_t(2 * ks), db + uint64_t(2 * ks), PROMOTE ? ks > 0 : 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
    if constexpr (PROMOTE) {
      const float s = scales[i & 63];
#pragma unroll
      for (int q = 0; q < 4; ++q) p[q] = fmaf(d[q], s, p[q]);
    }
  }
  const float* r = PROMOTE ? p : d;
  out[blockIdx.x * blockDim.x + threadIdx.x] = r[0] + r[1] + r[2] + r[3];
}

// Test 4: CTAs 0 and 1 hand a 256-int message back and forth `rounds` times (flags[32 b]: CTA b's
// count of sends, zeroed by the graph). Send: stores, __syncthreads, one thread fence.acq_rel.gpu +
// red.release.gpu.add. Receive: one thread spins on ld.acquire.gpu (SLEEP: __nanosleep 32..512 ns
// backoff), __syncthreads, plain loads checked. res: [0] errors, [1] timeouts, [2 + b] CTA b's SM.
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\nred.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
template <bool SLEEP>
__global__ void __launch_bounds__(256) k_pingpong(int* flags, int* data, int rounds, int* res) {
  __shared__ int s_timeout;
  const int me = int(blockIdx.x), other = 1 - me, t = int(threadIdx.x);
  if (t == 0) {
    int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    res[2 + me] = smid, s_timeout = 0;
  }
  int errs = 0;
  auto send = [&](int r) {
    data[me * 256 + t] = r;
    __syncthreads();
    if (t == 0) red_release_add(flags + 32 * me, 1);
  };
  auto recv = [&](int r) {  // false on a timeout (uniform over the CTA)
    if (t == 0) {
      unsigned ns = 32, polls = 0;
      while (ld_acquire(flags + 32 * other) < r + 1) {
        if (++polls > (1u << 20)) s_timeout = 1;  // about a second: the partner is not running
        if (s_timeout) break;
        if (SLEEP) __nanosleep(ns), ns = ns < 512 ? 2 * ns : 512;
      }
    }
    __syncthreads();
    if (s_timeout) return false;
    errs += data[other * 256 + t] != r;
    return true;
  };
  for (int r = 0; r < rounds; ++r) {
    if (me == 0) send(r);
    if (!recv(r)) break;
    if (me == 1) send(r);
  }
  if (errs) atomicAdd(res, errs);
  if (t == 0 && s_timeout) atomicAdd(res + 1, 1);
}

// Test 5: T tokens of H bf16 -> per-token amax -> s = max(amax, 1e-12) / 448 -> e4m3 codes of x / s
// (src/cuda/fp8_quotient.h's quotient, cvt.rn.satfinite.e4m3x2.f32) in shared memory, laid out as the
// wgmma B operand: slice k of token t at 1024 k + 128 t, 16-byte chunks XOR-swizzled by t.
// Chunk c (8 values) of the T * H / 8 is thread c % 256's, all loaded before any is used.
template <int T, int H>
__global__ void __launch_bounds__(256) k_xstage(const __nv_bfloat16* x, unsigned* sink) {
  constexpr int kChunksPerTok = H / 8, kChunks = T * kChunksPerTok, kPer = (kChunks + 255) / 256;
  static_assert(kChunksPerTok % 32 == 0, "a warp's 32 chunks lie in one token");
  __shared__ unsigned s_amax[T];
  __shared__ float s_scale[T], s_rcp[T];
  extern __shared__ unsigned char smem_raw[];
  unsigned char* codes = static_cast<unsigned char*>(align_smem_1024(smem_raw));
  const int tid = int(threadIdx.x), lane = tid % 32;
  if (tid < T) s_amax[tid] = 0u;
  uint4 v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int c = tid + 256 * j;
    v[j] = c < kChunks ? load_nc(reinterpret_cast<const uint4*>(x) + c) : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();  // s_amax zeroed
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int c = tid + 256 * j;
    if (c >= kChunks) break;  // warp-uniform (kChunks % 32 == 0)
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h2[e]);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) atomicMax(&s_amax[c / kChunksPerTok], __float_as_uint(m));  // m >= 0: bits order as values
  }
  __syncthreads();
  if (tid < T) {
    const float s = fmaxf(__uint_as_float(s_amax[tid]), 1e-12f) / 448.0f;
    s_scale[tid] = s;
    s_rcp[tid] = __frcp_rn(s);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int c = tid + 256 * j;
    if (c >= kChunks) break;
    const int t = c / kChunksPerTok, kk = 8 * (c % kChunksPerTok), b = kk % 128;
    const float s = s_scale[t], ri = s_rcp[t];
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
    uint16_t pr[4];  // codes of values 2e, 2e + 1 (low byte: 2e)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h2[e]);
      float q[2] = {f.x, f.y};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float q0 = __fmul_rn(q[k], ri), r = __fmaf_rn(-q0, s, q[k]);
        q[k] = r == 0.0f ? q0 : __fmaf_rn(r, ri, q0);
      }
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pr[e]) : "f"(q[1]), "f"(q[0]));
    }
    const int off = (kk / 128) * 1024 + t * 128 + ((((b / 16) ^ t) & 7) * 16) + (b % 16);
    *reinterpret_cast<uint2*>(codes + off) = make_uint2(pr[0] | uint32_t(pr[1]) << 16, pr[2] | uint32_t(pr[3]) << 16);
  }
  fence_proxy_async_smem();  // what the first wgmma would need
  __syncthreads();
  if (tid == 0) sink[blockIdx.x] = codes[(blockIdx.x % (H / 128)) * 1024];  // token 0, slice k, byte 0
}

// ------------------------------------------------------------------ host: timing and reporting
struct Ctx {
  cudaStream_t s = nullptr;
  cudaDeviceProp prop{};
  int dev = 0, G = 0, reps = 50, big_smem = 0;  // big_smem: dynamic smem that allows one CTA per SM
  void* flush = nullptr;
  size_t flush_bytes = 0;
  unsigned* sink = nullptr;
  float* out = nullptr;
} g;

enum class Flush { none, graph, harness };
const char* flush_name(Flush f) { return f == Flush::none ? "none" : f == Flush::graph ? "graph" : "harness"; }

struct Res {
  double med = NAN, mn = NAN;
  std::string err;  // why no time (launch or capture failed)
  bool ok() const { return err.empty(); }
};
std::vector<std::string> g_csv;

using Body = std::function<cudaError_t(cudaStream_t)>;

// An eager run, then capture (the flush memset first for Flush::graph), instantiate, 3 warm-up
// replays, g.reps timed replays back to back, one sync. Launch / capture failures come back in err.
Res time_graph(const Body& body, Flush fl) {
  Res r;
  cudaError_t e = body(g.s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.s);
  if (e != cudaSuccess) {
    r.err = std::string("eager launch failed: ") + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return r;
  }
  CK(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeThreadLocal));
  if (fl == Flush::graph) e = cudaMemsetAsync(g.flush, 1, g.flush_bytes, g.s);
  if (e == cudaSuccess) e = body(g.s);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(g.s, &graph);
  if (e != cudaSuccess || end != cudaSuccess) {
    r.err = std::string("graph capture failed: ") + cudaGetErrorString(e != cudaSuccess ? e : end);
    (void)cudaGetLastError();
    if (graph != nullptr) CK(cudaGraphDestroy(graph));
    return r;
  }
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, g.s));
  CK(cudaStreamSynchronize(g.s));
  std::vector<cudaEvent_t> ev(size_t(2 * g.reps));
  for (cudaEvent_t& x : ev) CK(cudaEventCreate(&x));
  for (int i = 0; i < g.reps; ++i) {
    if (fl != Flush::harness) k_pad<<<1, 32, 0, g.s>>>(kPadNs);
    CK(fl == Flush::harness ? cudaMemsetAsync(g.flush, i & 0xFF, g.flush_bytes, g.s) : cudaGetLastError());
    CK(cudaEventRecord(ev[size_t(2 * i)], g.s));
    CK(cudaGraphLaunch(exec, g.s));
    CK(cudaEventRecord(ev[size_t(2 * i + 1)], g.s));
  }
  CK(cudaStreamSynchronize(g.s));
  std::vector<double> us(size_t(g.reps));
  for (int i = 0; i < g.reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    us[size_t(i)] = 1e3 * ms;
  }
  for (cudaEvent_t x : ev) CK(cudaEventDestroy(x));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  std::sort(us.begin(), us.end());
  r.mn = us.front();
  r.med = us[us.size() / 2];
  return r;
}

__attribute__((format(printf, 1, 2))) std::string fmt(const char* f, ...) {
  char buf[512];
  va_list a;
  va_start(a, f);
  std::vsnprintf(buf, sizeof buf, f, a);
  va_end(a);
  return buf;
}

// One result: a human-readable line and a CSV row (param and derived hold no commas).
void report(const char* test, const std::string& param, const Res& r, const std::string& derived) {
  if (r.ok()) {
    std::printf("  %-46s median %9.2f us  min %9.2f us  %s\n", param.c_str(), r.med, r.mn, derived.c_str());
    g_csv.push_back(fmt("%s,%s,%.3f,%.3f,%s", test, param.c_str(), r.med, r.mn, derived.c_str()));
  } else {
    std::printf("  %-46s FAILED: %s\n", param.c_str(), r.err.c_str());
    std::string e = r.err;
    std::replace(e.begin(), e.end(), ',', ';');
    g_csv.push_back(fmt("%s,%s,,,FAILED: %s", test, param.c_str(), e.c_str()));
  }
}

template <class... KArgs, class... Args>
cudaError_t launch(void (*k)(KArgs...), int grid, int block, int smem, bool coop, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {dim3(unsigned(grid)), dim3(unsigned(block)), size_t(smem), s, attr, coop ? 1u : 0u};
  return [&](KArgs... c) {  // cudaLaunchKernelEx's coercion, with no zero-length array for a kernel without args
    void* p[] = {static_cast<void*>(&c)..., nullptr};
    return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k), p);
  }(args...);
}
template <class K>
void allow_smem(K* k, int bytes) {
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}
// Dynamic shared memory of at least `need` bytes that also keeps a second CTA off the SM.
int one_per_sm(int need) { return std::max(need, g.big_smem); }

// ------------------------------------------------------------------ the tests
void test_launch() {
  std::printf("\n[1] launch cost: G = %d CTAs x 128 threads, graph replays\n", g.G);
  int coop = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, g.dev));
  std::printf("  cudaDevAttrCooperativeLaunch = %d\n", coop);
  const Body nop = [](cudaStream_t) { return cudaSuccess; };
  const Res empty = time_graph(nop, Flush::none), mset = time_graph(nop, Flush::graph);
  report("launch", "empty graph", empty, "");
  report("launch", fmt("memset-only graph (%.1f MB)", g.flush_bytes / 1e6), mset, "");
  for (const Flush fl : {Flush::none, Flush::graph}) {
    const auto net = [&](const Res& r) {
      return fl == Flush::graph && r.ok() ? fmt("net_us=%.2f", r.med - mset.med) : std::string();
    };
    const char* f = flush_name(fl);
    const Res normal = time_graph([](cudaStream_t s) { return launch(k_empty, g.G, 128, 0, false, s); }, fl);
    report("launch", fmt("empty normal flush=%s", f), normal, net(normal));
    if (!coop) continue;
    const Res c0 = time_graph([](cudaStream_t s) { return launch(k_empty, g.G, 128, 0, true, s); }, fl);
    report("launch", fmt("empty coop flush=%s", f), c0, net(c0));
    const Res cb = time_graph([](cudaStream_t s) { return launch(k_empty, g.G, 128, g.big_smem, true, s); }, fl);
    report("launch", fmt("empty coop smem=%dKB flush=%s", g.big_smem / 1024, f), cb, net(cb));
    const Res c1 = time_graph([](cudaStream_t s) { return launch(k_gridsync<1>, g.G, 128, 0, true, s); }, fl);
    report("launch", fmt("coop 1 grid.sync flush=%s", f), c1, net(c1));
    const Res c3 = time_graph([](cudaStream_t s) { return launch(k_gridsync<3>, g.G, 128, 0, true, s); }, fl);
    report("launch", fmt("coop 3 grid.sync flush=%s", f), c3,
           c1.ok() && c3.ok() ? fmt("per_sync_us=%.2f", (c3.med - c1.med) / 2) : std::string());
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || p == nullptr) CK(cudaErrorNotSupported);  // no cuTensorMapEncodeTiled
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
}
// [rows, kK] uint8 codes, boxes of 128 bytes x box_rows, 128-byte swizzle (as cuda/tensor_map.h).
CUtensorMap code_map(const void* base, uint64_t rows, uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(kK), rows};
  const cuuint64_t strides[1] = {cuuint64_t(kK)};
  const cuuint32_t box[2] = {128, box_rows}, es[2] = {1, 1};
  const CUresult r = encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, es,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "%s:%d: cuTensorMapEncodeTiled: CUresult %d\n", __FILE__, __LINE__, r);
  if (r != CUDA_SUCCESS) std::exit(1);
  return m;
}

void test_stream() {
  const double targets[3] = {9.4e6, 38e6, 352e6};
  long long rows[3];
  for (int i = 0; i < 3; ++i) rows[i] = 64 * std::max(1LL, llround(targets[i] / (64.0 * kK)));
  void* buf = nullptr;
  const size_t max_bytes = size_t(rows[2]) * kK;
  CK(cudaMalloc(&buf, max_bytes));
  CK(cudaMemset(buf, 0x3C, max_bytes));
  std::printf("\n[2] weight stream: G = %d persistent CTAs, [rows, %d] fp8 codes, 64 x 128-code slices, "
              "contiguous 1/G share per CTA\n", g.G, kK);
  const CUtensorMap m64 = code_map(buf, uint64_t(rows[2]), 64), m8 = code_map(buf, uint64_t(rows[2]), 8);
  const Res mset = time_graph([](cudaStream_t) { return cudaSuccess; }, Flush::graph);
  report("stream", "memset-only graph", mset, "");
  struct Variant {
    std::string name;
    std::function<cudaError_t(cudaStream_t, long long rows)> run;
  };
  std::vector<Variant> vs;
  auto add_tma = [&](auto kernel, int S, int box_rows) {
    const int smem = one_per_sm(int(1024 + S * kStageBytes + 16 * S));
    allow_smem(kernel, smem);
    const CUtensorMap map = box_rows == 64 ? m64 : m8;
    vs.push_back({fmt("tma S=%d box=%dx128B", S, box_rows), [=](cudaStream_t s, long long r) {
                    return launch(kernel, g.G, 32 * (1 + kConsumerWarps), smem, false, s, map,
                                  r / 64 * (kK / kSlice), g.sink);
                  }});
  };
  add_tma(k_stream_tma<4, 64>, 4, 64);
  add_tma(k_stream_tma<8, 64>, 8, 64);
  add_tma(k_stream_tma<12, 64>, 12, 64);
  add_tma(k_stream_tma<12, 8>, 12, 8);
  auto add_ld = [&](auto kernel, int rp) {
    allow_smem(kernel, g.big_smem);
    vs.push_back({fmt("ld.nc 256thr rows/warp=%d", rp), [=](cudaStream_t s, long long r) {
                    return launch(kernel, g.G, 256, g.big_smem, false, s, static_cast<const uint4*>(buf), int(r),
                                  g.sink);
                  }});
  };
  add_ld(k_stream_ld<1>, 1);
  add_ld(k_stream_ld<2>, 2);
  for (const Variant& v : vs) {
    for (const Flush fl : {Flush::graph, Flush::harness, Flush::none}) {
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      int n = 0;
      for (int i = 0; i < 3; ++i) {
        const long long r = rows[i];
        const double bytes = double(r) * kK;
        const Res res = time_graph([&](cudaStream_t s) { return v.run(s, r); }, fl);
        const double t = fl == Flush::graph ? res.med - mset.med : res.med;
        report("stream", fmt("%s B=%.1fMB flush=%s", v.name.c_str(), bytes / 1e6, flush_name(fl)), res,
               res.ok() ? fmt("%sTB/s=%.3f", fl == Flush::graph ? fmt("net_us=%.2f;", t).c_str() : "",
                              bytes / t * 1e-6)
                        : std::string());
        if (!res.ok()) continue;
        sx += bytes, sy += t, sxx += bytes * bytes, sxy += bytes * t, ++n;
      }
      if (n == 3) {
        const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), icpt = (sy - slope * sx) / n;
        std::printf("  %-46s fit: ramp %.2f us + bytes / %.3f TB/s\n",
                    fmt("%s flush=%s", v.name.c_str(), flush_name(fl)).c_str(), icpt, 1e-6 / slope);
        g_csv.push_back(fmt("stream_fit,%s flush=%s,%.3f,,rate_TB/s=%.3f", v.name.c_str(), flush_name(fl), icpt,
                            1e-6 / slope));
      }
    }
  }
  CK(cudaFree(buf));
}

void test_wgmma() {
  const int it1 = 512, it2 = 4096;
  const double need = kAnchorTBs * 1e12 / g.G;
  std::printf("\n[3] wgmma m64n8k32 e4m3: G = %d CTAs, slice = 4 wgmma + commit + wait_group 0 (8 KB of A); "
              "need %.1f GB/s per SM (%.1f TB/s / %d SMs)\n", g.G, need * 1e-9, kAnchorTBs, g.G);
  auto one = [&](auto kernel, int nwg, bool promote) {
    const int smem = one_per_sm(kWgmmaSmem);
    allow_smem(kernel, smem);
    Res r[2];
    for (int k = 0; k < 2; ++k) {
      const int it = k == 0 ? it1 : it2;
      r[k] = time_graph([=](cudaStream_t s) { return launch(kernel, g.G, nwg * 128, smem, false, s, it, g.out); },
                        Flush::none);
      report("wgmma", fmt("wg=%d promote=%d slices/wg=%d", nwg, int(promote), it), r[k], "");
    }
    if (!r[0].ok() || !r[1].ok()) return;
    const double dt = (r[1].med - r[0].med) * 1e-6, per_sm = nwg * double(it2 - it1) / dt;
    const std::string d = fmt("slices/s/SM=%.3e;GB/s/SM=%.1f;x_need=%.2f;ns/slice/wg=%.1f", per_sm,
                              per_sm * 8192e-9, per_sm * 8192 / need, dt * 1e9 / (it2 - it1));
    std::printf("  %-46s slope: %s\n", fmt("wg=%d promote=%d", nwg, int(promote)).c_str(), d.c_str());
    g_csv.push_back(fmt("wgmma_rate,wg=%d promote=%d,%.3f,,%s", nwg, int(promote), r[1].med - r[0].med, d.c_str()));
  };
  one(k_wgmma<1, false>, 1, false);
  one(k_wgmma<1, true>, 1, true);
  one(k_wgmma<2, false>, 2, false);
  one(k_wgmma<2, true>, 2, true);
}

void test_flag() {
  const int r1 = 100, r2 = 1000;
  std::printf("\n[4] flag handoff: 2 CTAs x 256 threads (one per SM), rounds of send / receive each way\n");
  int *flags = nullptr, *data = nullptr, *res = nullptr;
  CK(cudaMalloc(&flags, 64 * sizeof(int)));  // flags[0], flags[32]: one 128-byte line each
  CK(cudaMalloc(&data, 512 * sizeof(int)));
  CK(cudaMalloc(&res, 4 * sizeof(int)));
  CK(cudaMemset(res, 0, 4 * sizeof(int)));
  auto one = [&](auto kernel, bool sleep) {
    allow_smem(kernel, g.big_smem);
    int h[4];
    CK(cudaMemsetAsync(flags, 0, 64 * sizeof(int), g.s));  // one eager run first: a hang is not replayed
    CK(launch(kernel, 2, 256, g.big_smem, false, g.s, flags, data, r1, res));
    CK(cudaMemcpyAsync(h, res, sizeof h, cudaMemcpyDeviceToHost, g.s));
    CK(cudaStreamSynchronize(g.s));
    if (h[1] != 0) {
      std::printf("  nanosleep=%d: %d CTA(s) timed out waiting for the other (SMs %d and %d); skipped\n", int(sleep),
                  h[1], h[2], h[3]);
      CK(cudaMemset(res, 0, 4 * sizeof(int)));
      return;
    }
    Res r[2];
    for (int k = 0; k < 2; ++k) {
      const int rounds = k == 0 ? r1 : r2;
      r[k] = time_graph(
          [=](cudaStream_t s) {
            const cudaError_t e = cudaMemsetAsync(flags, 0, 64 * sizeof(int), s);
            return e != cudaSuccess ? e : launch(kernel, 2, 256, g.big_smem, false, s, flags, data, rounds, res);
          },
          Flush::none);
      report("flag", fmt("nanosleep=%d rounds=%d", int(sleep), rounds), r[k], "");
    }
    CK(cudaMemcpy(h, res, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaMemset(res, 0, 4 * sizeof(int)));
    std::printf("  check: errors %d, timeouts %d, SMs %d and %d\n", h[0], h[1], h[2], h[3]);
    if (!r[0].ok() || !r[1].ok()) return;
    const double rt = (r[1].med - r[0].med) / (r2 - r1);
    const std::string d = fmt("round_trip_us=%.3f;one_way_us=%.3f;errors=%d;timeouts=%d;same_sm=%d", rt, rt / 2,
                              h[0], h[1], int(h[2] == h[3]));
    std::printf("  %-46s slope: %s\n", fmt("nanosleep=%d", int(sleep)).c_str(), d.c_str());
    g_csv.push_back(fmt("flag_rate,nanosleep=%d,%.3f,,%s", int(sleep), rt / 2, d.c_str()));
  };
  one(k_pingpong<false>, false);
  one(k_pingpong<true>, true);
  for (int* p : {flags, data, res}) CK(cudaFree(p));
}

void test_xstage() {
  std::printf("\n[5] x staging: G = %d CTAs x 256 threads, each: T x H bf16 -> amax -> e4m3 codes in smem\n", g.G);
  __nv_bfloat16* x = nullptr;
  const int n = 8 * 7168;
  std::vector<__nv_bfloat16> h(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) h[size_t(i)] = __float2bfloat16(float((i * 7919) % 2001 - 1000) / 250.0f);
  CK(cudaMalloc(&x, n * sizeof(__nv_bfloat16)));
  CK(cudaMemcpy(x, h.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  Res base[2];
  const Flush fls[2] = {Flush::graph, Flush::none};
  for (int f = 0; f < 2; ++f) {
    base[f] = time_graph([](cudaStream_t s) { return launch(k_empty, g.G, 256, g.big_smem, false, s); }, fls[f]);
    report("xstage", fmt("empty kernel (baseline) flush=%s", flush_name(fls[f])), base[f], "");
  }
  auto one = [&](auto kernel, int T, int H) {
    const int smem = one_per_sm(1024 + 8 * H);
    allow_smem(kernel, smem);
    for (int f = 0; f < 2; ++f) {
      const Res r = time_graph([=](cudaStream_t s) { return launch(kernel, g.G, 256, smem, false, s, x, g.sink); },
                               fls[f]);
      report("xstage", fmt("T=%d H=%d flush=%s", T, H, flush_name(fls[f])), r,
             r.ok() && base[f].ok() ? fmt("net_us=%.2f", r.med - base[f].med) : std::string());
    }
  };
  one(k_xstage<1, 4096>, 1, 4096);
  one(k_xstage<1, 7168>, 1, 7168);
  one(k_xstage<8, 4096>, 8, 4096);
  one(k_xstage<8, 7168>, 8, 7168);
  CK(cudaFree(x));
}

}  // namespace

int main(int argc, char** argv) {
  int only = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g.reps = std::max(20, std::atoi(argv[++i]));
    else return std::fprintf(stderr, "usage: %s [--only 1..5] [--reps N >= 20]\n", argv[0]), 2;
  }
  CK(cudaGetDevice(&g.dev));
  CK(cudaGetDeviceProperties(&g.prop, g.dev));
  g.G = g.prop.multiProcessorCount;
  g.big_smem = std::min(int(g.prop.sharedMemPerMultiprocessor / 2 + 1024), int(g.prop.sharedMemPerBlockOptin));
  g.flush_bytes = 2 * size_t(g.prop.l2CacheSize);
  std::printf("device %s (cc %d.%d): %d SMs, L2 %.1f MB, smem/SM %zu B, opt-in %zu B; flush buffer %.1f MB; "
              "%d replays per case\n", g.prop.name, g.prop.major, g.prop.minor, g.G, g.prop.l2CacheSize / 1e6,
              g.prop.sharedMemPerMultiprocessor, g.prop.sharedMemPerBlockOptin, g.flush_bytes / 1e6, g.reps);
  if (g.prop.major != 9) std::printf("WARNING: built for sm_90a only; this is cc %d.%d\n", g.prop.major, g.prop.minor);
  allow_smem(k_empty, g.big_smem);
  CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  CK(cudaMalloc(&g.flush, g.flush_bytes));
  CK(cudaMalloc(&g.sink, size_t(g.G) * 256 * sizeof(unsigned)));
  CK(cudaMalloc(&g.out, size_t(g.G) * 256 * sizeof(float)));
  if (only == 0 || only == 1) test_launch();
  if (only == 0 || only == 2) test_stream();
  if (only == 0 || only == 3) test_wgmma();
  if (only == 0 || only == 4) test_flag();
  if (only == 0 || only == 5) test_xstage();
  std::printf("\ncsv:\ntest,param,us_median,us_min,derived\n");
  for (const std::string& l : g_csv) std::printf("%s\n", l.c_str());
  for (void* p : {static_cast<void*>(g.out), static_cast<void*>(g.sink), g.flush}) CK(cudaFree(p));
  CK(cudaStreamDestroy(g.s));
  return 0;
}
