// The read-only stream of weight_stream.h. One persistent grid (2 CTAs of 512 threads per SM); the
// ranges are laid end to end as one index space of 16-byte vectors, cut into chunks of 32 lanes x 8
// vectors (4 KiB); warp w takes chunks w, w + warps, ... and issues a chunk's 8 loads per lane before
// using any (read-only path, no L1 allocation), like the decode kernels' weight loads. A range is at
// least one chunk in practice (an expert slab), so a chunk spans at most a few ranges: each lane finds
// its vector's range by walking forward from the chunk's first one.
// Tests: tests/test_weight_stream.cpp (checksum against the host; timing sanity).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_timing.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/weight_stream.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 512, kCtasPerSm = 2, kVecsPerLane = 8;
constexpr int64_t kChunk = 32 * kVecsPerLane;  // vectors per warp chunk

struct Range {
  const uint4* p;
  int64_t first;  // index of its first vector in the joined space
  int64_t n;      // vectors
};

__device__ __forceinline__ uint4 load_nc(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// XOR of every word read into *sink (one atomic per warp), so no load can be dropped.
__global__ void __launch_bounds__(kThreads) stream_kernel(const Range* r, int nr, int64_t total, unsigned* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * kThreads) >> 5;
  uint32_t x = 0;
  int ri = 0;  // the range of this warp's current chunk start (chunks ascend)
  for (int64_t c = warp * kChunk; c < total; c += warps * kChunk) {
    while (ri + 1 < nr && r[ri + 1].first <= c) ++ri;
    uint4 v[kVecsPerLane];
#pragma unroll
    for (int u = 0; u < kVecsPerLane; ++u) {
      const int64_t i = c + u * 32 + lane;
      int j = ri;
      while (j + 1 < nr && r[j + 1].first <= i) ++j;
      v[u] = i < total ? load_nc(r[j].p + (i - r[j].first)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kVecsPerLane; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) atomicXor(sink, x);
}

// Device copies of the range tables of every set, and the sink; freed by the destructor.
struct StreamTables {
  std::vector<Range*> tables;
  std::vector<int> counts;
  std::vector<int64_t> totals;
  unsigned* sink = nullptr;
  ~StreamTables() {
    for (Range* t : tables) cudaFree(t);
    if (sink != nullptr) cudaFree(sink);
  }
};

Status upload(const std::vector<std::vector<DeviceBytes>>& sets, StreamTables* st) {
  if (sets.empty()) return InvalidArgument("weight stream: no input set");
  for (size_t s = 0; s < sets.size(); ++s) {
    std::vector<Range> h;
    int64_t first = 0;
    for (const DeviceBytes& b : sets[s]) {
      if ((reinterpret_cast<uintptr_t>(b.data) & 15) != 0) {
        return InvalidArgument("weight stream: set ", s, ": range at ", b.data, " is not 16-byte aligned");
      }
      const int64_t n = int64_t(b.bytes / 16);
      if (n == 0) continue;
      h.push_back({static_cast<const uint4*>(b.data), first, n});
      first += n;
    }
    if (h.empty()) return InvalidArgument("weight stream: set ", s, " has no byte to read");
    Range* d = nullptr;
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(&d, h.size() * sizeof(Range)), "cudaMalloc (stream ranges)"));
    st->tables.push_back(d);
    MOEKIT_RETURN_IF_ERROR(
        check_cuda(cudaMemcpy(d, h.data(), h.size() * sizeof(Range), cudaMemcpyHostToDevice), "cudaMemcpy (ranges)"));
    st->counts.push_back(int(h.size()));
    st->totals.push_back(first);
  }
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(&st->sink, sizeof(unsigned)), "cudaMalloc (stream sink)"));
  return check_cuda(cudaMemset(st->sink, 0, sizeof(unsigned)), "cudaMemset (stream sink)");
}

Status launch_stream(const StreamTables& st, int s, cudaStream_t stream) {
  const int sms = current_device_facts_or_zero().sm_count;
  if (sms <= 0) return BackendError("weight stream: the device's SM count is unknown");
  const unsigned grid = unsigned(sms * kCtasPerSm);
  stream_kernel<<<grid, kThreads, 0, stream>>>(st.tables[size_t(s)], st.counts[size_t(s)], st.totals[size_t(s)],
                                               st.sink);
  return check_cuda(cudaGetLastError(), "weight stream launch");
}

}  // namespace

Status time_weight_stream(const std::vector<std::vector<DeviceBytes>>& sets, int warmup, int iters, L2Flush l2,
                          double* median_us) {
  if (median_us == nullptr) return InvalidArgument("weight stream: median_us must not be null");
  StreamTables st;
  MOEKIT_RETURN_IF_ERROR(upload(sets, &st));
  std::vector<double> us;
  MOEKIT_RETURN_IF_ERROR(time_graph(
      [&](void* stream, int s) { return launch_stream(st, s, static_cast<cudaStream_t>(stream)); },
      int(sets.size()), warmup, iters, l2, "weight stream", &us));
  *median_us = median_of(us);
  return Status::Ok();
}

Status weight_stream_checksum(const std::vector<DeviceBytes>& ranges, uint32_t* xor_out) {
  if (xor_out == nullptr) return InvalidArgument("weight stream: xor_out must not be null");
  StreamTables st;
  MOEKIT_RETURN_IF_ERROR(upload({ranges}, &st));
  MOEKIT_RETURN_IF_ERROR(launch_stream(st, 0, nullptr));
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaDeviceSynchronize(), "weight stream"));
  return check_cuda(cudaMemcpy(xor_out, st.sink, sizeof(unsigned), cudaMemcpyDeviceToHost), "cudaMemcpy (sink)");
}

}  // namespace moekit::cuda
