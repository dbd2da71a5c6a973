// Expert parallelism: the NCCL runner (include/moekit/ep.h: create_group, run). One process drives
// every rank's GPU: ncclCommInitAll over the devices, a stream per rank, grouped ncclSend /
// ncclRecv for the two all-to-alls (one ncclGroupStart / End around all ranks, as one thread must
// when it drives several communicators). Host plan (src/ep/ep_plan.cpp) from the routing copied to
// the host. Pack and combine are the kernels below; the experts run through the fused_moe front
// door on the rank's stream. Tests: tests/test_ep.cpp (suite Ep, the Nccl* cases: need >= 2 GPUs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <type_traits>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/bench_fill.h"
#include "cuda/cuda_utils.h"
#include "moekit/ep.h"

namespace moekit::ep {
namespace {

using cuda::check_cuda;
using cuda::last_launch;

Status check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return BackendError(what, ": ", ncclGetErrorString(r));
}

// The first failing send / receive of a group (the group is still closed with ncclGroupEnd).
struct P2p {
  Status first;
  void note(ncclResult_t r, const char* what) {
    if (first.ok() && r != ncclSuccess) static_cast<void>(first = check_nccl(r, what));
  }
};

// Row i of the send buffers <- row send_token[i] of x / topk_ids / topk_weights. V: the widest word
// dividing a row of x.
template <class V>
__global__ void pack_kernel(const V* x, const int32_t* ids, const float* w, const int32_t* send_token, int64_t words,
                            int k, V* sx, int32_t* sids, float* sw) {
  const int64_t i = blockIdx.x;
  const int64_t t = send_token[i];
  for (int64_t c = threadIdx.x; c < words; c += blockDim.x) sx[i * words + c] = x[t * words + c];
  if (threadIdx.x < k) {
    sids[i * k + threadIdx.x] = ids[t * k + threadIdx.x];
    sw[i * k + threadIdx.x] = w[t * k + threadIdx.x];
  }
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class TT>
__device__ __forceinline__ TT from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

constexpr int kFp8Threads = 256;

// fp8_dispatch pack: send row i <- x row send_token[i] as e4m3fn codes + scale = amax / 448 (1 for
// an all-zero row), plus its id / weight rows (include/moekit/ep.h).
template <class TT>
__global__ void __launch_bounds__(kFp8Threads) pack_fp8_kernel(const TT* x, const int32_t* ids, const float* w,
                                                                const int32_t* send_token, int64_t H, int k,
                                                                uint8_t* sq, float* sscale, int32_t* sids, float* sw) {
  __shared__ float s_red[kFp8Threads / 32];
  const int64_t i = blockIdx.x;
  const int64_t t = send_token[i];
  const TT* row = x + t * H;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += kFp8Threads) amax = fmaxf(amax, fabsf(to_f(row[c])));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) s_red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int j = 0; j < kFp8Threads / 32; ++j) amax = fmaxf(amax, s_red[j]);
  const float scale = amax > 0.0f ? amax / kFp8DispatchMax : 1.0f;
  for (int64_t c = threadIdx.x; c < H; c += kFp8Threads) sq[i * H + c] = f32_to_e4m3fn_bits(to_f(row[c]) / scale);
  if (threadIdx.x == 0) sscale[i] = scale;
  if (threadIdx.x < k) {
    sids[i * k + threadIdx.x] = ids[t * k + threadIdx.x];
    sw[i * k + threadIdx.x] = w[t * k + threadIdx.x];
  }
}

// fp8_dispatch receive: row i of x' = code * scale rounded to x's dtype.
template <class TT>
__global__ void __launch_bounds__(kFp8Threads) unpack_fp8_kernel(const uint8_t* q, const float* scale, int64_t H,
                                                                  TT* out) {
  const int64_t i = blockIdx.x;
  const float sc = scale[i];
  for (int64_t c = threadIdx.x; c < H; c += kFp8Threads) out[i * H + c] = from_f<TT>(e4m3fn_bits_to_f32(q[i * H + c]) * sc);
}


// out[t] = round(sum over d ascending of back[combine[t * world + d]]) (f32), zero when t sent nothing.
template <class TT>
__global__ void combine_kernel(const TT* back, const int32_t* combine, int world, int64_t H, TT* out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int d = 0; d < world; ++d) {
      const int32_t row = combine[t * world + d];
      if (row >= 0) acc += to_f(back[int64_t(row) * H + c]);
    }
    out[t * H + c] = from_f<TT>(acc);
  }
}

// A device buffer that only grows.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  Status ensure(size_t n, const char* what) {
    if (n <= bytes) return Status::Ok();
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    bytes = 0;
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(&p, std::max<size_t>(n, 256)), what));
    bytes = std::max<size_t>(n, 256);
    return Status::Ok();
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct RankState {
  int device = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  DevBuf send_x, send_ids, send_w, recv_x, recv_ids, recv_w, partial, back, send_token, combine, map, ws;
  DevBuf send_q, send_scale, recv_q, recv_scale;  // fp8_dispatch: codes + per-row scales
  cudaEvent_t ev[4] = {};
};

class GroupImpl final : public Group {
 public:
  std::vector<RankState> r;
  ~GroupImpl() override {
    for (RankState& q : r) {
      cudaSetDevice(q.device);
      if (q.comm != nullptr) ncclCommDestroy(q.comm);
      for (DevBuf* b : {&q.send_x, &q.send_ids, &q.send_w, &q.recv_x, &q.recv_ids, &q.recv_w, &q.partial, &q.back,
                        &q.send_token, &q.combine, &q.map, &q.ws, &q.send_q, &q.send_scale, &q.recv_q,
                        &q.recv_scale}) {
        if (b->p != nullptr) cudaFree(b->p);
      }
      for (cudaEvent_t e : q.ev) {
        if (e != nullptr) cudaEventDestroy(e);
      }
      if (q.stream != nullptr) cudaStreamDestroy(q.stream);
    }
  }
  int world() const override { return int(r.size()); }
  int device(int rank) const override { return r[size_t(rank)].device; }
  void* stream(int rank) const override { return r[size_t(rank)].stream; }
};

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

Status launch_pack(const RankInputs& in, RankState& q, int64_t rows, int64_t row_bytes, int k) {
  if (rows == 0) return Status::Ok();
  const unsigned blocks = unsigned(rows);
  const int32_t* st = q.send_token.as<int32_t>();
  if (row_bytes % 16 == 0) {
    pack_kernel<uint4><<<blocks, 256, 0, q.stream>>>(static_cast<const uint4*>(in.x.data), in.topk_ids.ptr<int32_t>(),
                                                     in.topk_weights.ptr<float>(), st, row_bytes / 16, k,
                                                     q.send_x.as<uint4>(), q.send_ids.as<int32_t>(),
                                                     q.send_w.as<float>());
  } else {
    pack_kernel<uint16_t><<<blocks, 256, 0, q.stream>>>(
        static_cast<const uint16_t*>(in.x.data), in.topk_ids.ptr<int32_t>(), in.topk_weights.ptr<float>(), st,
        row_bytes / 2, k, q.send_x.as<uint16_t>(), q.send_ids.as<int32_t>(), q.send_w.as<float>());
  }
  return last_launch("ep pack");
}

Status launch_pack_fp8(const RankInputs& in, RankState& q, int64_t rows, int k) {
  if (rows == 0) return Status::Ok();
  const int64_t H = in.x.shape[1];
  const int32_t* st = q.send_token.as<int32_t>();
  auto go = [&](auto* x) {
    using TT = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    pack_fp8_kernel<TT><<<unsigned(rows), kFp8Threads, 0, q.stream>>>(
        x, in.topk_ids.ptr<int32_t>(), in.topk_weights.ptr<float>(), st, H, k, q.send_q.as<uint8_t>(),
        q.send_scale.as<float>(), q.send_ids.as<int32_t>(), q.send_w.as<float>());
  };
  switch (in.x.dtype) {
    case DType::bf16: go(static_cast<const __nv_bfloat16*>(in.x.data)); break;
    case DType::f16: go(static_cast<const __half*>(in.x.data)); break;
    default: go(static_cast<const float*>(in.x.data));
  }
  return last_launch("ep pack_fp8");
}

Status launch_unpack_fp8(DType dt, RankState& q, int64_t rows, int64_t H) {
  if (rows == 0) return Status::Ok();
  const uint8_t* codes = q.recv_q.as<uint8_t>();
  const float* sc = q.recv_scale.as<float>();
  switch (dt) {
    case DType::bf16:
      unpack_fp8_kernel<<<unsigned(rows), kFp8Threads, 0, q.stream>>>(codes, sc, H, q.recv_x.as<__nv_bfloat16>());
      break;
    case DType::f16:
      unpack_fp8_kernel<<<unsigned(rows), kFp8Threads, 0, q.stream>>>(codes, sc, H, q.recv_x.as<__half>());
      break;
    default:
      unpack_fp8_kernel<<<unsigned(rows), kFp8Threads, 0, q.stream>>>(codes, sc, H, q.recv_x.as<float>());
  }
  return last_launch("ep unpack_fp8");
}

Status launch_combine(const RankInputs& in, RankState& q, int world) {
  const int64_t T = in.x.shape[0], H = in.x.shape[1];
  if (T == 0) return Status::Ok();
  const int32_t* cb = q.combine.as<int32_t>();
  switch (in.x.dtype) {
    case DType::bf16:
      combine_kernel<__nv_bfloat16><<<unsigned(T), 256, 0, q.stream>>>(q.back.as<__nv_bfloat16>(), cb, world, H,
                                                                       static_cast<__nv_bfloat16*>(in.out.data));
      break;
    case DType::f16:
      combine_kernel<__half><<<unsigned(T), 256, 0, q.stream>>>(q.back.as<__half>(), cb, world, H,
                                                                static_cast<__half*>(in.out.data));
      break;
    default:
      combine_kernel<float><<<unsigned(T), 256, 0, q.stream>>>(q.back.as<float>(), cb, world, H,
                                                               static_cast<float*>(in.out.data));
  }
  return last_launch("ep combine");
}

}  // namespace

bool nccl_available() { return true; }

Status create_group(const std::vector<int>& devices, std::unique_ptr<Group>* out) {
  int n = 0;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGetDeviceCount(&n), "ep create_group: cudaGetDeviceCount"));
  if (devices.empty()) return InvalidArgument("devices: need at least one device");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= n) {
      return InvalidArgument("devices: device ", devices[i], " (rank ", i, ") out of range, this process sees ", n);
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) return InvalidArgument("devices: device ", devices[i], " given twice");
    }
  }
  // NOTE: NVLink multicast (NVLS) off unless the caller chose otherwise: on shared hosts a program
  // that uses it can take the GPUs out of service; the all-to-all needs only point-to-point.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  auto g = std::make_unique<GroupImpl>();
  g->r.resize(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  MOEKIT_RETURN_IF_ERROR(check_nccl(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()),
                                    "ep create_group: ncclCommInitAll"));
  for (size_t i = 0; i < devices.size(); ++i) {
    RankState& q = g->r[i];
    q.device = devices[i];
    q.comm = comms[i];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep create_group: cudaSetDevice"));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking),
                                      "ep create_group: cudaStreamCreate"));
    for (cudaEvent_t& e : q.ev) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventCreate(&e), "ep create_group: cudaEventCreate"));
    }
  }
  *out = std::move(g);
  return Status::Ok();
}

Status run(Group& group, const std::vector<RankInputs>& ranks, int Eg, const Options& opts, PhaseTimes* times) {
  auto& g = static_cast<GroupImpl&>(group);
  const int world = g.world();
  if (int(ranks.size()) != world) {
    return InvalidArgument("ranks: the group has ", world, " ranks, got tensors for ", ranks.size());
  }
  MOEKIT_RETURN_IF_ERROR(validate(ranks, Eg, /*on_device=*/true));
  for (int r = 0; r < world; ++r) {
    if (ranks[r].x.device_index != g.r[r].device) {
      return InvalidArgument("rank ", r, " x: must live on the group's device ", g.r[r].device, ", got device ",
                             ranks[r].x.device_index);
    }
  }
  const int64_t H = ranks[0].x.shape[1], k = ranks[0].topk_ids.shape[1];
  const DType dt = ranks[0].x.dtype;
  const int64_t row_bytes = H * dtype_size(dt);

  // 1. plan on the host.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> host_ids(static_cast<size_t>(world));
  std::vector<const int32_t*> ids;
  std::vector<int64_t> tokens;
  for (int r = 0; r < world; ++r) {
    const int64_t T = ranks[r].x.shape[0];
    host_ids[r].resize(size_t(T * k));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(g.r[r].device), "ep run: cudaSetDevice"));
    if (T > 0) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(host_ids[r].data(), ranks[r].topk_ids.data, size_t(T * k) * 4,
                                                        cudaMemcpyDeviceToHost, g.r[r].stream),
                                        "ep run: routing to host"));
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(g.r[r].stream), "ep run: routing to host"));
    }
    ids.push_back(host_ids[r].data());
    tokens.push_back(T);
  }
  Plan plan;
  MOEKIT_RETURN_IF_ERROR(make_plan(world, Eg, int(k), ids, tokens, &plan));
  std::vector<int32_t> map(static_cast<size_t>(Eg));
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep run: cudaSetDevice"));
    const int64_t S = plan.sends(r), R = plan.recvs(r), T = tokens[r];
    MOEKIT_RETURN_IF_ERROR(q.send_x.ensure(size_t(S * row_bytes), "ep send_x"));
    MOEKIT_RETURN_IF_ERROR(q.send_ids.ensure(size_t(S * k * 4), "ep send_ids"));
    MOEKIT_RETURN_IF_ERROR(q.send_w.ensure(size_t(S * k * 4), "ep send_w"));
    MOEKIT_RETURN_IF_ERROR(q.back.ensure(size_t(S * row_bytes), "ep back"));
    MOEKIT_RETURN_IF_ERROR(q.recv_x.ensure(size_t(R * row_bytes), "ep recv_x"));
    MOEKIT_RETURN_IF_ERROR(q.recv_ids.ensure(size_t(R * k * 4), "ep recv_ids"));
    MOEKIT_RETURN_IF_ERROR(q.recv_w.ensure(size_t(R * k * 4), "ep recv_w"));
    MOEKIT_RETURN_IF_ERROR(q.partial.ensure(size_t(R * row_bytes), "ep partial"));
    MOEKIT_RETURN_IF_ERROR(q.send_token.ensure(size_t(S * 4), "ep send_token"));
    MOEKIT_RETURN_IF_ERROR(q.combine.ensure(size_t(T * world * 4), "ep combine"));
    MOEKIT_RETURN_IF_ERROR(q.map.ensure(size_t(Eg) * 4, "ep expert_map"));
    if (opts.fp8_dispatch) {
      MOEKIT_RETURN_IF_ERROR(q.send_q.ensure(size_t(S * H), "ep send_q"));
      MOEKIT_RETURN_IF_ERROR(q.send_scale.ensure(size_t(S) * 4, "ep send_scale"));
      MOEKIT_RETURN_IF_ERROR(q.recv_q.ensure(size_t(R * H), "ep recv_q"));
      MOEKIT_RETURN_IF_ERROR(q.recv_scale.ensure(size_t(R) * 4, "ep recv_scale"));
    }
    std::fill(map.begin(), map.end(), -1);
    for (int e = 0; e < plan.experts_per_rank; ++e) map[size_t(r * plan.experts_per_rank + e)] = e;
    // NOTE: synchronous copies (pageable host memory): the plan is host data of this call.
    if (S > 0) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(q.send_token.p, plan.send_token[r].data(), size_t(S) * 4,
                                                   cudaMemcpyHostToDevice), "ep run: plan upload"));
    }
    if (T > 0) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(q.combine.p, plan.combine_row[r].data(), size_t(T * world) * 4,
                                                   cudaMemcpyHostToDevice), "ep run: plan upload"));
    }
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(q.map.p, map.data(), size_t(Eg) * 4, cudaMemcpyHostToDevice),
                                      "ep run: plan upload"));
  }
  const auto t1 = std::chrono::steady_clock::now();

  // 2. dispatch: pack, then one all-to-all of rows, ids and weights.
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep run: cudaSetDevice"));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(q.ev[0], q.stream), "ep run: event"));
    if (opts.fp8_dispatch) {
      MOEKIT_RETURN_IF_ERROR(launch_pack_fp8(ranks[r], q, plan.sends(r), int(k)));
    } else {
      MOEKIT_RETURN_IF_ERROR(launch_pack(ranks[r], q, plan.sends(r), row_bytes, int(k)));
    }
  }
  const ncclDataType_t xt = nccl_type(dt);
  MOEKIT_RETURN_IF_ERROR(check_nccl(ncclGroupStart(), "ep dispatch: ncclGroupStart"));
  P2p p2p;
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    for (int d = 0; d < world; ++d) {
      const int64_t n = plan.count[size_t(r) * world + d];
      if (n == 0) continue;
      const int64_t off = plan.send_offset(r, d);
      if (opts.fp8_dispatch) {
        p2p.note(ncclSend(q.send_q.as<uint8_t>() + off * H, size_t(n * H), ncclUint8, d, q.comm, q.stream), "ncclSend");
        p2p.note(ncclSend(q.send_scale.as<float>() + off, size_t(n), ncclFloat32, d, q.comm, q.stream), "ncclSend");
      } else {
        p2p.note(ncclSend(q.send_x.as<char>() + off * row_bytes, size_t(n * H), xt, d, q.comm, q.stream), "ncclSend");
      }
      p2p.note(ncclSend(q.send_ids.as<int32_t>() + off * k, size_t(n * k), ncclInt32, d, q.comm, q.stream), "ncclSend");
      p2p.note(ncclSend(q.send_w.as<float>() + off * k, size_t(n * k), ncclFloat32, d, q.comm, q.stream), "ncclSend");
    }
    for (int s = 0; s < world; ++s) {
      const int64_t n = plan.count[size_t(s) * world + r];
      if (n == 0) continue;
      const int64_t off = plan.recv_offset(r, s);
      if (opts.fp8_dispatch) {
        p2p.note(ncclRecv(q.recv_q.as<uint8_t>() + off * H, size_t(n * H), ncclUint8, s, q.comm, q.stream), "ncclRecv");
        p2p.note(ncclRecv(q.recv_scale.as<float>() + off, size_t(n), ncclFloat32, s, q.comm, q.stream), "ncclRecv");
      } else {
        p2p.note(ncclRecv(q.recv_x.as<char>() + off * row_bytes, size_t(n * H), xt, s, q.comm, q.stream), "ncclRecv");
      }
      p2p.note(ncclRecv(q.recv_ids.as<int32_t>() + off * k, size_t(n * k), ncclInt32, s, q.comm, q.stream), "ncclRecv");
      p2p.note(ncclRecv(q.recv_w.as<float>() + off * k, size_t(n * k), ncclFloat32, s, q.comm, q.stream), "ncclRecv");
    }
  }
  MOEKIT_RETURN_IF_ERROR(check_nccl(ncclGroupEnd(), "ep dispatch: ncclGroupEnd"));
  MOEKIT_RETURN_IF_ERROR(p2p.first);

  // 3. experts on the received rows.
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep run: cudaSetDevice"));
    const int64_t R = plan.recvs(r);
    if (opts.fp8_dispatch) MOEKIT_RETURN_IF_ERROR(launch_unpack_fp8(dt, q, R, H));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(q.ev[1], q.stream), "ep run: event"));
    if (R > 0) {
      const int dev = q.device;
      FusedMoeParams p;
      p.x = TensorView::contiguous(q.recv_x.p, dt, {R, H}, Device::cuda, dev);
      p.w1 = ranks[r].w1;
      p.w2 = ranks[r].w2;
      p.topk_ids = TensorView::contiguous(q.recv_ids.p, DType::i32, {R, k}, Device::cuda, dev);
      p.topk_weights = TensorView::contiguous(q.recv_w.p, DType::f32, {R, k}, Device::cuda, dev);
      p.out = TensorView::contiguous(q.partial.p, dt, {R, H}, Device::cuda, dev);
      p.expert_map = TensorView::contiguous(q.map.p, DType::i32, {int64_t(Eg)}, Device::cuda, dev);
      p.w1_scale = ranks[r].w1_scale;
      p.w2_scale = ranks[r].w2_scale;
      p.scale_block_n = opts.scale_block_n;
      p.scale_block_k = opts.scale_block_k;
      p.activation = opts.activation;
      p.round_intermediate = opts.round_intermediate;
      p.weight_on_input = opts.weight_on_input;
      RunOptions ro;
      ro.stream = q.stream;
      size_t ws = 0;
      MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(p, ro, &ws));
      MOEKIT_RETURN_IF_ERROR(q.ws.ensure(ws, "ep fused_moe workspace"));
      ro.workspace = q.ws.p;
      ro.workspace_bytes = q.ws.bytes;
      MOEKIT_RETURN_IF_ERROR(fused_moe(p, ro));
    }
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(q.ev[2], q.stream), "ep run: event"));
  }

  // 4. combine: partial rows back to their sources (into the send-row order), then the sum.
  MOEKIT_RETURN_IF_ERROR(check_nccl(ncclGroupStart(), "ep combine: ncclGroupStart"));
  p2p = P2p{};
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    for (int s = 0; s < world; ++s) {  // r as expert rank: rows it received from s go back
      const int64_t n = plan.count[size_t(s) * world + r];
      if (n == 0) continue;
      p2p.note(ncclSend(q.partial.as<char>() + plan.recv_offset(r, s) * row_bytes, size_t(n * H), xt, s, q.comm,
                        q.stream),
               "ncclSend");
    }
    for (int d = 0; d < world; ++d) {  // r as source: its rows come back from d
      const int64_t n = plan.count[size_t(r) * world + d];
      if (n == 0) continue;
      p2p.note(ncclRecv(q.back.as<char>() + plan.send_offset(r, d) * row_bytes, size_t(n * H), xt, d, q.comm,
                        q.stream),
               "ncclRecv");
    }
  }
  MOEKIT_RETURN_IF_ERROR(check_nccl(ncclGroupEnd(), "ep combine: ncclGroupEnd"));
  MOEKIT_RETURN_IF_ERROR(p2p.first);
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep run: cudaSetDevice"));
    MOEKIT_RETURN_IF_ERROR(launch_combine(ranks[r], q, world));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaEventRecord(q.ev[3], q.stream), "ep run: event"));
  }
  PhaseTimes pt;
  pt.plan_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  for (int r = 0; r < world; ++r) {
    RankState& q = g.r[r];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(q.device), "ep run: cudaSetDevice"));
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(q.stream), "ep run: step"));
    float a = 0, b = 0, c = 0, tot = 0;
    cudaEventElapsedTime(&a, q.ev[0], q.ev[1]);
    cudaEventElapsedTime(&b, q.ev[1], q.ev[2]);
    cudaEventElapsedTime(&c, q.ev[2], q.ev[3]);
    cudaEventElapsedTime(&tot, q.ev[0], q.ev[3]);
    pt.dispatch_ms = std::max(pt.dispatch_ms, double(a));
    pt.experts_ms = std::max(pt.experts_ms, double(b));
    pt.combine_ms = std::max(pt.combine_ms, double(c));
    pt.total_ms = std::max(pt.total_ms, double(tot));
  }
  if (times != nullptr) *times = pt;
  return Status::Ok();
}

Status bench(const std::vector<int>& devices, int Eg, int k, int64_t H, int64_t I, int64_t tokens_per_rank, int warmup,
             int iters, const Options& opts, BenchResult* out) {
  const int world = int(devices.size());
  if (world < 1 || Eg % world != 0 || k < 1 || k > Eg || tokens_per_rank < 0 || iters < 1) {
    return InvalidArgument("ep bench: bad shape (world ", world, ", Eg ", Eg, ", k ", k, ", tokens ", tokens_per_rank,
                           ", iters ", iters, ")");
  }
  std::unique_ptr<Group> group;
  MOEKIT_RETURN_IF_ERROR(create_group(devices, &group));
  const int64_t T = tokens_per_rank, E = Eg / world;
  std::vector<void*> allocs;
  struct Free {
    std::vector<void*>* a;
    ~Free() {
      for (void* p : *a) cudaFree(p);
    }
  } free_all{&allocs};
  auto alloc = [&](size_t bytes, void** p) {
    *p = nullptr;
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(p, std::max<size_t>(bytes, 16)), "ep bench: cudaMalloc"));
    allocs.push_back(*p);
    return Status::Ok();
  };
  std::mt19937_64 gen(1);
  std::vector<RankInputs> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const int dev = devices[size_t(r)];
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaSetDevice(dev), "ep bench: cudaSetDevice"));
    void *x, *ids, *w, *w1, *w2, *o;
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * H) * 2, &x));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * k) * 4, &ids));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * k) * 4, &w));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(E * 2 * I * H) * 2, &w1));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(E * H * I) * 2, &w2));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * H) * 2, &o));
    MOEKIT_RETURN_IF_ERROR(cuda::fill_normal_device(x, DType::bf16, T * H, 1.0f, 11 + r));
    MOEKIT_RETURN_IF_ERROR(cuda::fill_normal_device(w1, DType::bf16, E * 2 * I * H, 0.02f, 21 + r));
    MOEKIT_RETURN_IF_ERROR(cuda::fill_normal_device(w2, DType::bf16, E * H * I, 0.02f, 31 + r));
    std::vector<int32_t> hid(static_cast<size_t>(T * k));
    std::vector<float> hw(static_cast<size_t>(T * k), 1.0f / float(k));
    std::vector<int32_t> pool(static_cast<size_t>(Eg));
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {  // partial Fisher-Yates: k distinct experts
        std::uniform_int_distribution<int> pick(j, Eg - 1);
        std::swap(pool[size_t(j)], pool[size_t(pick(gen))]);
        hid[size_t(t * k + j)] = pool[size_t(j)];
      }
    }
    if (T > 0) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice), "ep bench"));
      MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "ep bench"));
    }
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaDeviceSynchronize(), "ep bench: fill"));
    RankInputs& q = ranks[size_t(r)];
    q.x = TensorView::contiguous(x, DType::bf16, {T, H}, Device::cuda, dev);
    q.topk_ids = TensorView::contiguous(ids, DType::i32, {T, int64_t(k)}, Device::cuda, dev);
    q.topk_weights = TensorView::contiguous(w, DType::f32, {T, int64_t(k)}, Device::cuda, dev);
    q.w1 = TensorView::contiguous(w1, DType::bf16, {E, 2 * I, H}, Device::cuda, dev);
    q.w2 = TensorView::contiguous(w2, DType::bf16, {E, H, I}, Device::cuda, dev);
    q.out = TensorView::contiguous(o, DType::bf16, {T, H}, Device::cuda, dev);
  }
  std::vector<PhaseTimes> samples;
  for (int i = 0; i < warmup + iters; ++i) {
    PhaseTimes pt;
    MOEKIT_RETURN_IF_ERROR(run(*group, ranks, Eg, opts, &pt));
    if (i >= warmup) samples.push_back(pt);
  }
  auto median = [&](double PhaseTimes::*m) {
    std::vector<double> v;
    for (const PhaseTimes& p : samples) v.push_back(p.*m);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  BenchResult res;
  res.iters = iters;
  res.median.plan_ms = median(&PhaseTimes::plan_ms);
  res.median.dispatch_ms = median(&PhaseTimes::dispatch_ms);
  res.median.experts_ms = median(&PhaseTimes::experts_ms);
  res.median.combine_ms = median(&PhaseTimes::combine_ms);
  res.median.total_ms = median(&PhaseTimes::total_ms);
  // Dispatch bytes from one plan of this routing (the same every step).
  std::vector<std::vector<int32_t>> hids(static_cast<size_t>(world));
  std::vector<const int32_t*> ptrs;
  std::vector<int64_t> toks;
  for (int r = 0; r < world; ++r) {
    hids[size_t(r)].resize(size_t(T * k));
    cudaSetDevice(devices[size_t(r)]);
    if (T > 0) cudaMemcpy(hids[size_t(r)].data(), ranks[size_t(r)].topk_ids.data, size_t(T * k) * 4, cudaMemcpyDeviceToHost);
    ptrs.push_back(hids[size_t(r)].data());
    toks.push_back(T);
  }
  Plan plan;
  MOEKIT_RETURN_IF_ERROR(make_plan(world, Eg, k, ptrs, toks, &plan));
  const double row_bytes = opts.fp8_dispatch ? double(H) + 4.0 : double(H) * 2.0;  // codes + scale, or bf16
  for (int r = 0; r < world; ++r) res.dispatch_bytes += double(plan.sends(r)) * row_bytes;
  *out = res;
  return Status::Ok();
}

}  // namespace moekit::ep
