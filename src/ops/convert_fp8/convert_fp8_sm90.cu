// convert_fp8_sm90: the Hopper e4m3fn <-> e4m3fnuz checkpoint conversion (SPEC 5, contract
// moekit/ops/quant.h), bit-identical to convert_fp8_ref. One kernel: 16 codes per thread and step
// (one 16-byte load and store when both pointers are 16-byte aligned, else byte by byte), then the
// scales (x2 / x0.5, exact). Elementwise, so in == out (in place) is fine. Deterministic always.
// Test: tests/test_convert_fp8.cpp (Cuda* cases) and every case of check_convert_fp8
// (src/testing/check_layout_quant.cpp) against the ref.
//
// Bit rules, four codes per 32-bit word with byte-SIMD compares (__vcmpeq4): fn -> fnuz: 0x80 (-0)
// -> 0x00, S.1111.111 (NaN) -> 0x80; fnuz -> fn: 0x80 (NaN) -> 0x00, 0x7F / 0xFF (+-240) -> 0x7E /
// 0xFE (+-448, counted).
//
// num_saturated is a host output: when the caller asks for it, the count is summed on the device
// (a per-warp integer atomicAdd into a __device__ counter, so the total is exact and order-free),
// copied back and the stream is synchronised: that call is not graph-capturable and is refused
// while the stream is being captured. Concurrent counted calls are serialised by a host mutex (the
// counter is one per device). With num_saturated == nullptr: no synchronisation, no allocation,
// CUDA-graph capturable.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "moekit/ops/quant.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kCtasPerSm = 8;  // grid-stride: at most 8 CTAs per SM of the device

__device__ unsigned long long g_saturated;  // the counted call's total (guarded by the host mutex)

struct Args {
  const uint8_t* in;
  uint8_t* out;
  int64_t n;        // codes
  int64_t nvec;     // leading 16-code chunks (0 on the byte path); codes [16 * nvec, n) one by one
  const float* scale_in;
  float* scale_out;
  int64_t n_scales;
  float factor;     // 2 (fn -> fnuz) or 0.5
  bool to_fnuz;
  unsigned long long* saturated;  // nullptr: not counted
};

// Four codes; *sat += the number of fnuz +-240 codes clamped.
__device__ __forceinline__ uint32_t convert4(uint32_t w, bool to_fnuz, uint32_t* sat) {
  const uint32_t m80 = __vcmpeq4(w, 0x80808080u);                 // -0 (fn) / NaN (fnuz)
  const uint32_t m7f = __vcmpeq4(w & 0x7F7F7F7Fu, 0x7F7F7F7Fu);   // NaN (fn) / +-240 (fnuz)
  if (to_fnuz) return (w & ~(m80 | m7f)) | (m7f & 0x80808080u);
  *sat += uint32_t(__popc(m7f)) >> 3;
  return (w & ~m80) ^ (m7f & 0x01010101u);
}

__global__ void __launch_bounds__(kThreads) convert_kernel(const Args a) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  uint32_t sat = 0;
  for (int64_t c = tid; c < a.nvec; c += stride) {
    uint4 u = reinterpret_cast<const uint4*>(a.in)[c];
    u.x = convert4(u.x, a.to_fnuz, &sat);
    u.y = convert4(u.y, a.to_fnuz, &sat);
    u.z = convert4(u.z, a.to_fnuz, &sat);
    u.w = convert4(u.w, a.to_fnuz, &sat);
    reinterpret_cast<uint4*>(a.out)[c] = u;
  }
  for (int64_t i = a.nvec * 16 + tid; i < a.n; i += stride) {
    a.out[i] = uint8_t(convert4(a.in[i], a.to_fnuz, &sat) & 0xFFu);  // the upper bytes are 0x00: untouched
  }
  for (int64_t i = tid; i < a.n_scales; i += stride) a.scale_out[i] = __fmul_rn(a.scale_in[i], a.factor);
  if (a.saturated != nullptr) {
    const uint32_t warp_sat = __reduce_add_sync(0xFFFFFFFFu, sat);
    if ((threadIdx.x & 31) == 0 && warp_sat != 0) atomicAdd(a.saturated, (unsigned long long)warp_sat);
  }
}

Status supports(const ConvertFp8Params& p) {
  return require_device({{"in", &p.in}, {"out", &p.out}, {"scale_in", &p.scale_in}, {"scale_out", &p.scale_out}});
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status launch(const Args& a, cudaStream_t stream) {
  const int64_t work = std::max(a.nvec + (a.n - a.nvec * 16), a.n_scales);
  DeviceFacts dev;
  MOEKIT_RETURN_IF_ERROR(current_device_facts(&dev));
  const int64_t max_grid = kCtasPerSm * dev.sm_count;
  const int grid = int(std::min<int64_t>(max_grid, std::max<int64_t>(1, (work + kThreads - 1) / kThreads)));
  convert_kernel<<<grid, kThreads, 0, stream>>>(a);
  return last_launch("convert_fp8_sm90: convert_kernel");
}

Status run(const ConvertFp8Params& p, const RunContext& ctx) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  Args a;
  a.to_fnuz = p.in.dtype == DType::fp8_e4m3fn;
  a.in = p.in.ptr<const uint8_t>();
  a.out = p.out.ptr<uint8_t>();
  a.n = p.in.numel();
  a.nvec = aligned16(a.in) && aligned16(a.out) ? a.n / 16 : 0;
  a.scale_in = p.scale_in.present() ? p.scale_in.ptr<const float>() : nullptr;
  a.scale_out = p.scale_in.present() ? p.scale_out.ptr<float>() : nullptr;
  a.n_scales = p.scale_in.present() ? p.scale_in.numel() : 0;
  a.factor = a.to_fnuz ? 2.0f : 0.5f;
  a.saturated = nullptr;
  if (p.num_saturated == nullptr) return launch(a, stream);

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamIsCapturing(stream, &capture), "convert_fp8_sm90: cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) {
    return InvalidArgument("num_saturated: convert_fp8_sm90 returns the count through a host synchronisation, which "
                           "a stream under graph capture cannot do; pass num_saturated = nullptr");
  }
  static std::mutex counter_mutex;
  std::lock_guard<std::mutex> lock(counter_mutex);
  void* counter = nullptr;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGetSymbolAddress(&counter, g_saturated), "convert_fp8_sm90: cudaGetSymbolAddress"));
  a.saturated = static_cast<unsigned long long*>(counter);
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), stream),
                                    "convert_fp8_sm90: cudaMemsetAsync (counter)"));
  MOEKIT_RETURN_IF_ERROR(launch(a, stream));
  unsigned long long total = 0;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(&total, counter, sizeof(total), cudaMemcpyDeviceToHost, stream),
                                    "convert_fp8_sm90: cudaMemcpyAsync (count)"));
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(stream), "convert_fp8_sm90: cudaStreamSynchronize"));
  *p.num_saturated = int64_t(total);
  return Status::Ok();
}

}  // namespace

void register_convert_fp8_sm90(Registry& r) {
  r.add({"convert_fp8_sm90", OpKind::convert_fp8, MoeVariant::none, Backend::cuda,
         "fp8 e4m3fn <-> e4m3fnuz bits + f32 scales x2 / x0.5; bit-identical to the ref; num_saturated syncs", 100,
         erase_supports<ConvertFp8Params, supports>, nullptr, erase_run<ConvertFp8Params, run>});
}

}  // namespace moekit::cuda
