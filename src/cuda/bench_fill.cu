// Counter-based normal fill of device buffers for the bench (contract: bench_fill.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/bench_fill.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"

namespace moekit::cuda {

namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

template <class T>
__global__ void fill_normal(T* __restrict__ dst, int64_t n, float stddev, uint64_t seed) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(i)));
    const float u1 = float((h >> 40) + 1) * (1.0f / 16777216.0f);  // (0, 1]: log(u1) is finite
    const float u2 = float(h & 0xFFFFFFu) * (1.0f / 16777216.0f);   // [0, 1)
    store(dst + i, stddev * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

}  // namespace

Status fill_normal_device(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) {
  if (n <= 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("fill_normal_device: dst is null for n = ", n);
  const int threads = 256;
  DeviceFacts dev;
  MOEKIT_RETURN_IF_ERROR(current_device_facts(&dev));
  const int blocks = int(std::min<int64_t>(ceil_div(n, threads), 32 * int64_t(dev.sm_count)));  // 32 per SM
  switch (dtype) {
    case DType::f32: fill_normal<<<blocks, threads>>>(static_cast<float*>(dst), n, stddev, seed); break;
    case DType::bf16: fill_normal<<<blocks, threads>>>(static_cast<__nv_bfloat16*>(dst), n, stddev, seed); break;
    case DType::f16: fill_normal<<<blocks, threads>>>(static_cast<__half*>(dst), n, stddev, seed); break;
    default: return Unsupported("fill_normal_device: dtype must be bf16, f16 or f32, got ", dtype_name(dtype));
  }
  MOEKIT_RETURN_IF_ERROR(last_launch("fill_normal_device"));
  return check_cuda(cudaDeviceSynchronize(), "fill_normal_device: cudaDeviceSynchronize");
}

}  // namespace moekit::cuda
