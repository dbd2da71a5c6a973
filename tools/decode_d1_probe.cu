// The D1 probe of docs/design/fused_moe_decode.md: a standalone prototype of the decode kernel's
// gate/up phase P1 on the fp8 tile engine (sections 2.3, 2.4, 2.7 and the D0 results of section 6),
// fp8_block (128 x 128 weight blocks, 1 x 128 x groups; x given as codes, not quantized here), g1u1,
// 1 <= T <= 8 tokens.
//   P1: one persistent launch of G = SM-count CTAs (queried; cooperative where the grid is resident),
//     one CTA per SM. Units = (expert e, 64-row i-tile i0): gate rows e 2I + i0 .. +63 and up rows
//     e 2I + I + i0 .. +63; each has KT = H / 128 slices. The flat slice space (unit-major, S = units
//     KT) is cut into G contiguous pieces, [c S / G, (c + 1) S / G), so a unit can be split between
//     CTAs (stream-K). Warps 0-3 are the consumer warpgroup, warp 4 lane 0 the producer: TMA of both
//     64 x 128-code boxes (gate, up; 128-byte swizzle) of each slice into a ring of >= 8 16 KB
//     stages; it waits only on free stages. The consumers stage x's codes of all T tokens (the wgmma
//     B operand: 8 rows x 128 codes per slice, rows >= T zero), the x scales and the CTA's weight
//     scales in shared memory, then per slice: 4 + 4 wgmma m64n8k32 e4m3 (operands swapped: A =
//     weights, B = tokens), wait, release the stage, promote (partial x w_scale x x_scale of the
//     thread's two columns) into gate / up f32 sums. At the end of each unit segment: the partial
//     sums to ws[unit][segment][gate, up][64][8] (segment = c - the unit's first CTA).
//   finisher: an ordinary kernel (in the design it follows the grid barrier) sums each unit's
//     segments in segment order and writes a[e][t][i] = silu(g) u in f32 for t < T.
//   stream: the same kernel with the consumers only waiting for and releasing each stage (no B, no
//     wgmma): the same bytes through the same ring, the ceiling.
// Checks (--only check): small problems (ne = 2, I = 384, H = 1024 at T = 3, 8; ne = 3, I = 256,
// H = 1152 at T = 1) against a double host reference (max |err| / max |ref| <= 1e-3) at G = SM count,
// 7 and 131 (units cut into several segments; at 131 > S some pieces are empty), with a and the
// workspace preset to NaN bytes (a slot never written shows), and bit-identical repeats. Data: random
// e4m3 codes with |v| in [1/16, 15], scales uniform in [0.02, 0.06) (w) and [0.05, 0.15) (x).
// Timing (--only time): Mixtral-, DeepSeek-V3- and Qwen3-like w1 at T = 1, 8: P1, P1 + finisher and
// the stream; CUDA-graph replays (--reps, default 50, >= 20), the L2 flushed before each by a memset
// of max(2 x L2, 128 MiB) outside the graph and the events (as src/cuda/cuda_timing.cu); median and
// min, TB/s of w1 bytes, frac_stream = stream_us / us. Exit status 1 when a check fails.
// Not built by CMake; on a GPU machine from the repository root (scripts/gpu_d1.sh):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -I include tools/decode_d1_probe.cu -o /tmp/d1
//   /tmp/d1 [--only check|time] [--reps R]
#include <cuda.h>
#include <cudaTypedefs.h>
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

using namespace moekit::cuda::sm90;

namespace {

constexpr int kSlice = 128;               // codes (bytes) per slice and row
constexpr uint32_t kBoxBytes = 64 * 128;  // one 64-row x 128-code TMA box
constexpr uint32_t kStageBytes = 2 * kBoxBytes;  // gate box, then up box
constexpr int kThreads = 160;             // consumer warpgroup (warps 0-3) + producer warp 4
constexpr int kMinStages = 8, kMaxStages = 12;
constexpr double kTol = 1e-3;

// The CTA whose piece [c S / G, (c + 1) S / G) holds slice q: the largest c with c S / G <= q
// (pieces may be empty when G > S; the largest such c has a non-empty piece that holds q).
__host__ __device__ __forceinline__ int owner_of(long long q, long long S, int G) {
  return int(((q + 1) * G - 1) / S);
}

struct P1Args {
  const uint8_t* x;       // [T, H] e4m3 codes
  const float* w_scale;   // [ne, 2I / 128, KT]
  const float* x_scale;   // [T, KT]
  float* ws;              // [units, maxseg, 2, 64, 8] partial sums (gate, up)
  long long S;            // slices in all (units x KT)
  int T, I, H, KT, tiles; // tiles = I / 64: units per expert
  int stages, maxseg;
  uint32_t off_b, off_bar, off_xs, off_wsc;  // shared-memory offsets from the 1024-aligned base
};

__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, 128;" ::: "memory"); }
// wgmma m64n8k32 e4m3: sm90::wgmma_fp8_n8 (A 64 x 32 and B 8 x 32 codes, K-major, 128-byte swizzle).
// D fragment: thread (warp w of the group, lane l) holds d[0], d[1] = row 16 w + l / 4, columns
// 2 (l % 4), +1, and d[2], d[3] = the same columns of row + 8.

// P1 (kMath) or the stream ceiling (!kMath); grid G, kThreads threads, one CTA per SM. Shared memory
// from the 1024-aligned base: stages x 16 KB ring | B: KT x 1 KB | 2 x stages mbarriers (full,
// empty) | x scales [KT][8] f32 | the piece's weight scales [n] float2 (gate, up).
template <bool kMath>
__global__ void __launch_bounds__(kThreads, 1) k_p1(const __grid_constant__ CUtensorMap map, const P1Args a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = static_cast<unsigned char*>(align_smem_1024(smem_raw));
  const uint32_t sbase = smem_addr(base), bar0 = sbase + a.off_bar;
  const int G = int(gridDim.x), c = int(blockIdx.x), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const long long q0 = a.S * c / G, q1 = a.S * (c + 1) / G;
  const int n = int(q1 - q0), KT = a.KT;
  auto full = [&](int s) { return bar0 + 8u * uint32_t(s); };
  auto empty = [&](int s) { return bar0 + 8u * uint32_t(a.stages + s); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) mbar_init(full(s), 1), mbar_init(empty(s), 4);  // 4 consumer warps
    mbar_init_fence();
    tma_prefetch_desc(&map);
  }
  __syncthreads();
  if (n == 0) return;
  if (warp == 4) {  // producer: the piece's slices in order, both boxes per stage
    if (lane == 0) {
      long long u = q0 / KT;
      int kt = int(q0 % KT), s = 0;
      uint32_t ph = 0;
      for (int j = 0; j < n; ++j) {
        mbar_wait(empty(s), ph ^ 1u);
        mbar_arrive_expect_tx(full(s), kStageBytes);
        const int rg = int(u / a.tiles) * 2 * a.I + int(u % a.tiles) * 64;  // first gate row
        const uint32_t dst = sbase + uint32_t(s) * kStageBytes;
        tma_load_2d(dst, &map, kt * kSlice, rg, full(s));
        tma_load_2d(dst + kBoxBytes, &map, kt * kSlice, rg + a.I, full(s));
        if (++kt == KT) kt = 0, ++u;
        if (++s == a.stages) s = 0, ph ^= 1u;
      }
    }
    return;  // no CTA barrier follows; the consumers' waits cover every TMA in flight
  }
  if constexpr (!kMath) {
    int s = 0;
    uint32_t ph = 0;
    for (int j = 0; j < n; ++j) {
      mbar_wait(full(s), ph);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(s));
      if (++s == a.stages) s = 0, ph ^= 1u;
    }
    return;
  } else {
    const int tid = int(threadIdx.x);
    float* xs = reinterpret_cast<float*>(base + a.off_xs);
    float2* wsc = reinterpret_cast<float2*>(base + a.off_wsc);
    // B: token t's codes of slice k at 1024 k + 128 t, 16-byte chunk j at chunk j ^ t (the 128-byte
    // swizzle of an 8 x 128-byte atom, row = t); rows t >= T zero.
    const int cpt = a.H / 16;
    for (int i = tid; i < 8 * cpt; i += 128) {
      const int t = i / cpt, kk = 16 * (i % cpt);
      const uint4 v =
          t < a.T ? __ldg(reinterpret_cast<const uint4*>(a.x + size_t(t) * a.H + kk)) : make_uint4(0, 0, 0, 0);
      const int off = (kk / 128) * 1024 + t * 128 + ((((kk % 128) / 16) ^ t) & 7) * 16;
      *reinterpret_cast<uint4*>(base + a.off_b + off) = v;
    }
    for (int i = tid; i < 8 * KT; i += 128) {
      const int kt = i / 8, t = i % 8;
      xs[i] = t < a.T ? __ldg(a.x_scale + t * KT + kt) : 0.0f;
    }
    for (int j = tid; j < n; j += 128) {
      const long long q = q0 + j, u = q / KT;
      const int kt = int(q % KT), rg = int(u / a.tiles) * 2 * a.I + int(u % a.tiles) * 64;
      wsc[j] = make_float2(__ldg(a.w_scale + size_t(rg / 128) * KT + kt),
                           __ldg(a.w_scale + size_t((rg + a.I) / 128) * KT + kt));
    }
    fence_proxy_async_smem();  // B's generic writes -> the async proxy (wgmma)
    consumer_bar();
    const uint32_t b0 = sbase + a.off_b;
    const int r = 16 * warp + lane / 4, col = 2 * (lane % 4);
    float accg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, accu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float pg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pu[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // ignored by ks = 0 (scale-d 0)
    long long u = q0 / KT;
    int kt = int(q0 % KT), s = 0, seg = c - owner_of(u * KT, a.S, G);
    uint32_t ph = 0;
    for (int j = 0; j < n; ++j) {
      mbar_wait(full(s), ph);
      const uint32_t st = sbase + uint32_t(s) * kStageBytes;
      const uint64_t dg = wgmma_desc_sw128(st), du = wgmma_desc_sw128(st + kBoxBytes);
      const uint64_t db = wgmma_desc_sw128(b0 + uint32_t(kt) * 1024u);
      fence_regs(pg);
      fence_regs(pu);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n8(pg, dg + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n8(pu, du + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(pg);
      fence_regs(pu);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(s));
      const float2 xv = *reinterpret_cast<const float2*>(xs + kt * 8 + col), wv = wsc[j];
      const float g0 = wv.x * xv.x, g1 = wv.x * xv.y, u0 = wv.y * xv.x, u1 = wv.y * xv.y;
      accg[0] = fmaf(pg[0], g0, accg[0]), accg[1] = fmaf(pg[1], g1, accg[1]);
      accg[2] = fmaf(pg[2], g0, accg[2]), accg[3] = fmaf(pg[3], g1, accg[3]);
      accu[0] = fmaf(pu[0], u0, accu[0]), accu[1] = fmaf(pu[1], u1, accu[1]);
      accu[2] = fmaf(pu[2], u0, accu[2]), accu[3] = fmaf(pu[3], u1, accu[3]);
      if (++kt == KT || j == n - 1) {  // end of this CTA's segment of unit u
        float* w = a.ws + (size_t(u) * a.maxseg + size_t(seg)) * 2 * 512;
        *reinterpret_cast<float2*>(w + r * 8 + col) = make_float2(accg[0], accg[1]);
        *reinterpret_cast<float2*>(w + (r + 8) * 8 + col) = make_float2(accg[2], accg[3]);
        *reinterpret_cast<float2*>(w + 512 + r * 8 + col) = make_float2(accu[0], accu[1]);
        *reinterpret_cast<float2*>(w + 512 + (r + 8) * 8 + col) = make_float2(accu[2], accu[3]);
#pragma unroll
        for (int q = 0; q < 4; ++q) accg[q] = 0.0f, accu[q] = 0.0f;
        if (kt == KT) kt = 0, ++u, seg = 0;  // this CTA holds the next unit's first slice
      }
      if (++s == a.stages) s = 0, ph ^= 1u;
    }
  }
}

// One block of 512 threads per unit: thread (col = tid / 64, row = tid % 64); the unit's segments
// (CTAs c0 .. c1 that overlap it; slot c - c0, skipping CTAs with empty pieces) summed in segment
// order; a[e][t][i0 + row] = silu(g) u for t = col < T.
__global__ void __launch_bounds__(512) k_finish(const float* ws, float* out, long long S, int G, int KT, int tiles,
                                                int I, int T, int maxseg) {
  const long long u = blockIdx.x;
  const int col = int(threadIdx.x) / 64, row = int(threadIdx.x) % 64;
  if (col >= T) return;
  const int c0 = owner_of(u * KT, S, G), c1 = owner_of((u + 1) * KT - 1, S, G);
  const float* w = ws + size_t(u) * maxseg * 1024 + row * 8 + col;
  float g = 0.0f, up = 0.0f;
  for (int c = c0; c <= c1; ++c) {  // NOTE: with G > S some pieces are empty: their slots were never written
    if (S * c / G == S * (c + 1) / G) continue;
    g += w[(c - c0) * 1024], up += w[(c - c0) * 1024 + 512];
  }
  const int e = int(u / tiles), i = int(u % tiles) * 64 + row;
  out[(size_t(e) * T + col) * I + i] = g / (1.0f + expf(-g)) * up;
}

// Deterministic fill: e4m3 codes with a random sign, exponent field 3..10 and mantissa (|v| in
// [0.0625, 15]: finite, no NaN codes), or floats uniform in [lo, hi).
__host__ __device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(z ^ (z >> 31));
}
__global__ void k_fill_codes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i, seed);
    p[i] = uint8_t((h & 0x80u) | ((3u + (h >> 8) % 8u) << 3) | ((h >> 16) & 7u));
  }
}
__global__ void k_fill_f32(float* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * float(hash32(i, seed) >> 8) * (1.0f / 16777216.0f);
}

// ------------------------------------------------------------------ host
struct Ctx {
  cudaStream_t s = nullptr;
  cudaDeviceProp prop{};
  int dev = 0, sms = 0, reps = 50;
  void* flush = nullptr;
  size_t flush_bytes = 0;
} g;

__attribute__((format(printf, 1, 2))) std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}
std::vector<std::string> g_csv;

struct Res {
  double med = NAN, mn = NAN;
  std::string err;
  bool ok() const { return err.empty(); }
};
using Body = std::function<cudaError_t(cudaStream_t)>;

// An eager run, capture, instantiate, 3 warm-up replays, then per sample: the flush memset (a new
// byte value each time), event, graph replay, event; one sync at the end.
Res time_graph(const Body& body) {
  Res r;
  cudaError_t e = body(g.s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.s);
  if (e != cudaSuccess) {
    r.err = std::string("eager launch failed: ") + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return r;
  }
  CK(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeThreadLocal));
  e = body(g.s);
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
    CK(cudaMemsetAsync(g.flush, i & 0xFF, g.flush_bytes, g.s));
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

template <class... KArgs, class... Args>
cudaError_t launch(void (*k)(KArgs...), int grid, int block, int smem, bool coop, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {dim3(unsigned(grid)), dim3(unsigned(block)), size_t(smem), s, attr, coop ? 1u : 0u};
  return [&](KArgs... c) {
    void* p[] = {static_cast<void*>(&c)..., nullptr};
    return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k), p);
  }(args...);
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || p == nullptr) CK(cudaErrorNotSupported);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
}
// w1 as a [rows, H] uint8 matrix, boxes of 128 codes x 64 rows, 128-byte swizzle (as cuda/tensor_map.h).
CUtensorMap code_map(const void* base, uint64_t rows, uint64_t H) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(H), rows};
  const cuuint64_t strides[1] = {cuuint64_t(H)};
  const cuuint32_t box[2] = {128, 64}, es[2] = {1, 1};
  const CUresult r = encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, es,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "%s:%d: cuTensorMapEncodeTiled: CUresult %d\n", __FILE__, __LINE__, r);
  if (r != CUDA_SUCCESS) std::exit(1);
  return m;
}

// One problem on the device: w1 codes [ne, 2I, H], x codes [8, H] (the first T used), scales, a.
struct Problem {
  int ne = 0, I = 0, H = 0;
  uint8_t *w = nullptr, *x = nullptr;
  float *w_scale = nullptr, *x_scale = nullptr, *a = nullptr;
  CUtensorMap map{};
  int KT() const { return H / kSlice; }
  int units() const { return ne * (I / 64); }
  size_t w_bytes() const { return size_t(ne) * 2 * I * H; }
  void alloc(int ne_, int I_, int H_, uint32_t seed) {
    ne = ne_, I = I_, H = H_;
    if (I % 128 || H % 128) std::fprintf(stderr, "I and H must be multiples of 128\n"), std::exit(2);
    const size_t nws = size_t(ne) * (2 * I / 128) * KT();
    CK(cudaMalloc(&w, w_bytes()));
    CK(cudaMalloc(&x, size_t(8) * H));
    CK(cudaMalloc(&w_scale, nws * sizeof(float)));
    CK(cudaMalloc(&x_scale, size_t(8) * KT() * sizeof(float)));
    CK(cudaMalloc(&a, size_t(ne) * 8 * I * sizeof(float)));
    k_fill_codes<<<1024, 256, 0, g.s>>>(w, w_bytes(), seed);
    k_fill_codes<<<64, 256, 0, g.s>>>(x, size_t(8) * H, seed + 1);
    k_fill_f32<<<64, 256, 0, g.s>>>(w_scale, nws, seed + 2, 0.02f, 0.06f);
    k_fill_f32<<<8, 256, 0, g.s>>>(x_scale, size_t(8) * KT(), seed + 3, 0.05f, 0.15f);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(g.s));
    map = code_map(w, uint64_t(ne) * 2 * I, uint64_t(H));
  }
  void release() {
    for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(w_scale),
                    static_cast<void*>(x_scale), static_cast<void*>(a)})
      CK(cudaFree(p));
  }
};

// The launch plan of P1 at grid G: pieces, segments, ring stages, shared memory, workspace.
struct Plan {
  P1Args args{};
  int G = 0, smem = 0, maxn = 0, units = 0;
  bool coop = false;
  float* ws = nullptr;
};
Plan make_plan(const Problem& p, int T, int G) {
  Plan pl;
  P1Args& a = pl.args;
  const int KT = p.KT();
  pl.G = G, pl.units = p.units();
  a.S = (long long)pl.units * KT, a.T = T, a.I = p.I, a.H = p.H, a.KT = KT, a.tiles = p.I / 64;
  a.x = p.x, a.w_scale = p.w_scale, a.x_scale = p.x_scale;
  for (int c = 0; c < G; ++c) pl.maxn = std::max(pl.maxn, int(a.S * (c + 1) / G - a.S * c / G));
  a.maxseg = 0;
  for (long long u = 0; u < pl.units; ++u)
    a.maxseg = std::max(a.maxseg, owner_of((u + 1) * KT - 1, a.S, G) - owner_of(u * KT, a.S, G) + 1);
  const int fixed = 1024 + KT * 1024 + 8 * KT * 4 + 8 * pl.maxn;  // slack, B, x scales, w scales
  const int optin = int(g.prop.sharedMemPerBlockOptin);
  a.stages = std::min(kMaxStages, (optin - fixed) / int(kStageBytes + 16));
  if (a.stages < kMinStages) {
    std::fprintf(stderr, "H = %d, %d slices per CTA: only %d stages fit in %d B of shared memory\n", p.H, pl.maxn,
                 a.stages, optin);
    std::exit(2);
  }
  a.off_b = uint32_t(a.stages) * kStageBytes;
  a.off_bar = a.off_b + uint32_t(KT) * 1024u;
  a.off_xs = a.off_bar + 16u * uint32_t(a.stages);
  a.off_wsc = a.off_xs + 32u * uint32_t(KT);
  pl.smem = std::max(int(1024 + a.off_wsc + 8 * pl.maxn), int(g.prop.sharedMemPerMultiprocessor / 2 + 1024));
  pl.smem = std::min(pl.smem, optin);
  CK(cudaFuncSetAttribute(k_p1<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem));
  CK(cudaFuncSetAttribute(k_p1<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_p1<true>, kThreads, size_t(pl.smem)));
  int coop_attr = 0;
  CK(cudaDeviceGetAttribute(&coop_attr, cudaDevAttrCooperativeLaunch, g.dev));
  pl.coop = coop_attr != 0 && G <= occ * g.sms;  // resident grid: cooperative, as the design launches
  CK(cudaMalloc(&pl.ws, size_t(pl.units) * a.maxseg * 1024 * sizeof(float)));
  a.ws = pl.ws;
  return pl;
}

cudaError_t run_p1(const Problem& p, const Plan& pl, bool math, cudaStream_t s) {
  return launch(math ? k_p1<true> : k_p1<false>, pl.G, kThreads, pl.smem, pl.coop, s, p.map, pl.args);
}
cudaError_t run_finish(const Problem& p, const Plan& pl, cudaStream_t s) {
  const P1Args& a = pl.args;
  k_finish<<<pl.units, 512, 0, s>>>(pl.ws, p.a, a.S, pl.G, a.KT, a.tiles, p.I, a.T, a.maxseg);
  return cudaGetLastError();
}

// ------------------------------------------------------------------ check
double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}

// Host reference in double: a[e][t][i] = silu(g) u, g / u = sum_k w(row) x(t) with both dequantized.
std::vector<double> reference(const Problem& p, int T) {
  const int KT = p.KT(), N1 = 2 * p.I;
  std::vector<uint8_t> w(p.w_bytes()), x(size_t(8) * p.H);
  std::vector<float> ws(size_t(p.ne) * (N1 / 128) * KT), xs(size_t(8) * KT);
  CK(cudaMemcpy(w.data(), p.w, w.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(x.data(), p.x, x.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ws.data(), p.w_scale, ws.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(xs.data(), p.x_scale, xs.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<double> xd(size_t(T) * p.H), ref(size_t(p.ne) * T * p.I);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < p.H; ++k) xd[size_t(t) * p.H + k] = e4m3_value(x[size_t(t) * p.H + k]) * xs[t * KT + k / 128];
  auto dot = [&](int e, int row, int t) {
    double s = 0;
    const size_t r = size_t(e) * N1 + row;
    const float* wsr = ws.data() + (size_t(e) * (N1 / 128) + row / 128) * KT;
    for (int k = 0; k < p.H; ++k) s += e4m3_value(w[r * p.H + k]) * wsr[k / 128] * xd[size_t(t) * p.H + k];
    return s;
  };
  for (int e = 0; e < p.ne; ++e)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < p.I; ++i) {
        const double gg = dot(e, i, t), uu = dot(e, p.I + i, t);
        ref[(size_t(e) * T + t) * p.I + i] = gg / (1.0 + std::exp(-gg)) * uu;
      }
  return ref;
}

// P1 + finisher at grid G (a and ws first set to NaN bytes), twice; error against ref, bit equality.
bool check_one(const Problem& p, int T, int G, const std::vector<double>& ref) {
  Plan pl = make_plan(p, T, G);
  const size_t na = size_t(p.ne) * T * p.I;
  std::vector<float> out[2];
  for (int rep = 0; rep < 2; ++rep) {
    CK(cudaMemsetAsync(p.a, 0xFF, na * sizeof(float), g.s));
    CK(cudaMemsetAsync(pl.ws, 0xFF, size_t(pl.units) * pl.args.maxseg * 1024 * sizeof(float), g.s));
    CK(run_p1(p, pl, true, g.s));
    CK(run_finish(p, pl, g.s));
    CK(cudaStreamSynchronize(g.s));
    out[rep].resize(na);
    CK(cudaMemcpy(out[rep].data(), p.a, na * sizeof(float), cudaMemcpyDeviceToHost));
  }
  double max_err = 0, max_ref = 0;
  size_t bad = 0;
  for (size_t i = 0; i < na; ++i) {
    const double d = std::fabs(double(out[0][i]) - ref[i]);
    if (!(d <= 1e30)) ++bad;  // NaN: never written
    else max_err = std::max(max_err, d);
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  const bool same = std::memcmp(out[0].data(), out[1].data(), na * sizeof(float)) == 0;
  const double rel = max_err / std::max(max_ref, 1e-30);
  const bool ok = bad == 0 && rel <= kTol && same;
  std::printf("  ne=%d I=%d H=%d T=%d G=%-4d %s stages=%d smem=%d max_seg/unit=%d slices/CTA<=%d: "
              "max|err|/max|ref| = %.3e (max|ref| %.3e)%s%s  %s\n",
              p.ne, p.I, p.H, T, G, pl.coop ? "coop" : "normal", pl.args.stages, pl.smem, pl.args.maxseg, pl.maxn,
              rel, max_ref, bad ? fmt(", %zu unwritten", bad).c_str() : "",
              same ? ", repeat bit-identical" : ", REPEAT DIFFERS",
              ok ? "ok" : "FAIL");
  g_csv.push_back(fmt("check,ne=%d I=%d H=%d T=%d G=%d,%.3e,%d", p.ne, p.I, p.H, T, G, rel, int(ok)));
  CK(cudaFree(pl.ws));
  return ok;
}

bool run_checks() {
  std::printf("\n[check] P1 + finisher against a double host reference (tolerance %.0e of max|ref|)\n", kTol);
  // The owner formula against the piece bounds, for the grids used here.
  for (const long long S : {96LL, 108LL, 14336LL})
    for (const int G : {1, 7, 131, g.sms})
      for (int c = 0; c < G; ++c)
        for (long long q = S * c / G; q < S * (c + 1) / G; ++q)
          if (owner_of(q, S, G) != c) return std::printf("  owner_of(%lld, %lld, %d) != %d\n", q, S, G, c), false;
  bool ok = true;
  struct Case { int ne, I, H; std::vector<int> Ts; };
  const Case cases[] = {{2, 384, 1024, {3, 8}}, {3, 256, 1152, {1}}};
  for (const Case& cs : cases) {
    Problem p;
    p.alloc(cs.ne, cs.I, cs.H, 1234u + uint32_t(cs.H));
    for (const int T : cs.Ts) {
      const std::vector<double> ref = reference(p, T);
      for (const int G : {g.sms, 7, 131}) ok = check_one(p, T, G, ref) && ok;
    }
    p.release();
  }
  std::printf("  check: %s\n", ok ? "all ok" : "FAILED");
  return ok;
}

// ------------------------------------------------------------------ timing
void report(const std::string& what, const Res& r, double bytes, double stream_us) {
  if (!r.ok()) {
    std::printf("  %-44s FAILED: %s\n", what.c_str(), r.err.c_str());
    g_csv.push_back(fmt("time,%s,,,FAILED", what.c_str()));
    return;
  }
  const double tbs = bytes / r.med * 1e-6, frac = stream_us / r.med;
  std::printf("  %-44s median %8.2f us  min %8.2f us  %.3f TB/s  frac_stream %.3f\n", what.c_str(), r.med, r.mn,
              tbs, frac);
  g_csv.push_back(fmt("time,%s,%.3f,%.3f,%.4f,%.4f", what.c_str(), r.med, r.mn, tbs, frac));
}

void run_timing() {
  std::printf("\n[time] G = %d CTAs x %d threads; graph replays, median of %d, L2 flushed (%.1f MB memset) "
              "before each, outside the events\n", g.sms, kThreads, g.reps, g.flush_bytes / 1e6);
  struct Shape { const char* name; int ne, I, H; };
  const Shape shapes[] = {{"Mixtral", 2, 14336, 4096}, {"DeepSeek-V3", 8, 2048, 7168}, {"Qwen3", 8, 768, 2048}};
  for (const Shape& sh : shapes) {
    Problem p;
    p.alloc(sh.ne, sh.I, sh.H, 77u);
    const double bytes = double(p.w_bytes());
    Plan ps = make_plan(p, 8, g.sms);
    std::printf(" %s: ne=%d I=%d H=%d, w1 %.1f MB, %lld slices (%.1f per CTA), stages=%d (%u KB ring), smem=%d B "
                "(%s), max segments per unit %d\n", sh.name, sh.ne, sh.I, sh.H, bytes / 1e6, ps.args.S,
                double(ps.args.S) / g.sms, ps.args.stages, ps.args.stages * kStageBytes / 1024, ps.smem,
                ps.coop ? "cooperative" : "normal launch", ps.args.maxseg);
    const Res rs = time_graph([&](cudaStream_t s) { return run_p1(p, ps, false, s); });
    report(fmt("%s stream (same ring, no math)", sh.name), rs, bytes, rs.med);
    for (const int T : {1, 8}) {
      Plan pl = make_plan(p, T, g.sms);
      const Res r1 = time_graph([&](cudaStream_t s) { return run_p1(p, pl, true, s); });
      report(fmt("%s T=%d P1", sh.name, T), r1, bytes, rs.med);
      const Res r2 = time_graph([&](cudaStream_t s) {
        const cudaError_t e = run_p1(p, pl, true, s);
        return e != cudaSuccess ? e : run_finish(p, pl, s);
      });
      report(fmt("%s T=%d P1 + finisher", sh.name, T), r2, bytes, rs.med);
      CK(cudaFree(pl.ws));
    }
    CK(cudaFree(ps.ws));
    p.release();
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool do_check = true, do_time = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      const std::string w = argv[++i];
      do_check = w == "check", do_time = w == "time";
      if (!do_check && !do_time) return std::fprintf(stderr, "--only check|time\n"), 2;
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g.reps = std::max(20, std::atoi(argv[++i]));
    } else {
      return std::fprintf(stderr, "usage: %s [--only check|time] [--reps R >= 20]\n", argv[0]), 2;
    }
  }
  CK(cudaGetDevice(&g.dev));
  CK(cudaGetDeviceProperties(&g.prop, g.dev));
  g.sms = g.prop.multiProcessorCount;
  g.flush_bytes = std::max(size_t(128) << 20, 2 * size_t(g.prop.l2CacheSize));
  std::printf("device %s (cc %d.%d): %d SMs, L2 %.1f MB, smem opt-in %zu B; flush %.1f MB; %d replays per case\n",
              g.prop.name, g.prop.major, g.prop.minor, g.sms, g.prop.l2CacheSize / 1e6, g.prop.sharedMemPerBlockOptin,
              g.flush_bytes / 1e6, g.reps);
  if (g.prop.major != 9) std::printf("WARNING: built for sm_90a only; this is cc %d.%d\n", g.prop.major, g.prop.minor);
  CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  CK(cudaMalloc(&g.flush, g.flush_bytes));
  bool ok = true;
  if (do_check) ok = run_checks();
  if (do_time) run_timing();
  std::printf("\ncsv:\nkind,case,us_median_or_rel_err,us_min_or_ok,TB/s,frac_stream\n");
  for (const std::string& l : g_csv) std::printf("%s\n", l.c_str());
  CK(cudaFree(g.flush));
  CK(cudaStreamDestroy(g.s));
  return ok ? 0 : 1;
}
