// sort_tokens Hopper kernels (SPEC 2, contract include/moekit/ops/sorting.h): a stable counting
// sort of the T*k (token, slot) entries by local expert, in five launches on the caller's stream
// (graph-capturable: fixed grids, scratch only from the workspace). Deterministic always: no
// atomics decide an order (the one atomic only counts bad ids). Test: tests/test_sort_tokens.cpp
// (Cuda*), compared bit-exactly with sort_tokens_ref through check_sort_tokens
// (src/testing/check_sort_tokens.cpp).
//
//   1. local_table: local[g] for every global expert g (mask: running count of the kept experts,
//      map: the map, else g); values outside [0, E) become -1 (dropped). Zeroes the error counter.
//   2. histogram: one warp per chunk of `chunk` consecutive entries (chunk = 32 * steps); each
//      step of 32 entries groups equal experts with __match_any_sync and the group's leader adds its
//      size to the warp's shared-memory counts; writes counts[chunk][E]. Ids outside [-1, Eg) are
//      skipped and counted in the error counter.
//   3. scan (one CTA, thread per expert): totals, padded run lengths, run starts (block scan), then
//      counts[chunk][e] becomes the offset where chunk's first entry of e goes (exclusive scan over
//      chunks, in chunk order). Writes num_valid and error_count.
//   4. scatter: the warps walk their chunks again in the same order; an entry's position is its
//      chunk's offset for its expert plus its rank among equal experts earlier in the step. Entries
//      therefore land in (token, slot) order inside each expert, exactly as the reference.
//   5. fill: every position that holds no entry gets the padding value and weight +0.0f, and every
//      block its expert (binary search over the run starts) or -1. Disjoint from step 4's writes.
// Limits: E <= 1024 (shared-memory counts per warp), T*k <= 2^31 - 1 (the front door's limit).
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/block_scan.cuh"
#include "cuda/cuda_utils.h"
#include "moekit/ops/sorting.h"

namespace moekit::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxLocalExperts = 1024;
constexpr int kWarpsPerBlock = 4;     // histogram / scatter CTAs: 4 chunks each
constexpr int kScanThreads = 1024;    // local_table / scan: one CTA, thread per expert
static_assert(kScanThreads == 1024, "the scans use block_inclusive_sum_1024");
constexpr int kMinSteps = 16;         // steps of 32 entries per chunk, at least
constexpr int64_t kMaxChunks = 1024;  // bounds the counts table (and the scan's serial walk)
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Problem sizes and the workspace layout; the same function serves workspace_bytes() and run().
struct Plan {
  int64_t N = 0;       // T * k entries
  int64_t Eg = 0;      // global experts (length of the local table)
  int E = 0;           // local experts
  int64_t steps = 0;   // 32-entry steps per chunk
  int64_t chunks = 0;  // ceil(N / (32 * steps))
  size_t off_err = 0, off_local = 0, off_counts = 0, off_start = 0, off_total = 0, bytes = 0;
};

Plan make_plan(const SortTokensParams& p) {
  Plan pl;
  pl.N = p.topk_ids.shape[0] * p.topk_ids.shape[1];
  pl.E = p.num_experts;
  pl.Eg = p.expert_mask.present() ? p.expert_mask.shape[0]
          : p.expert_map.present() ? p.expert_map.shape[0]
                                   : int64_t(p.num_experts);
  const int64_t need = (pl.N + kWarp * kMaxChunks - 1) / (kWarp * kMaxChunks);
  pl.steps = need > kMinSteps ? need : kMinSteps;
  pl.chunks = (pl.N + kWarp * pl.steps - 1) / (kWarp * pl.steps);
  size_t at = 0;
  pl.off_err = at;
  at += align_up(sizeof(int32_t));
  pl.off_local = at;
  at += align_up(size_t(pl.Eg) * sizeof(int32_t));
  pl.off_counts = at;
  at += align_up(size_t(pl.chunks) * size_t(pl.E) * sizeof(int32_t));
  pl.off_start = at;
  at += align_up(size_t(pl.E + 1) * sizeof(int32_t));
  pl.off_total = at;
  at += align_up(size_t(pl.E) * sizeof(int32_t));
  pl.bytes = at;
  return pl;
}

struct Args {
  const int32_t* ids;
  const float* weights;
  const int32_t* mask;  // nullptr when absent
  const int32_t* map;   // nullptr when absent
  int32_t T, k, E, block_m;
  int64_t N, Eg, steps, chunks;
  bool packed;
  int32_t pad;  // padding value of sorted_token_ids
  int64_t max_padded, max_blocks;
  int32_t* out_ids;
  float* out_w;
  int32_t* out_e;
  int32_t* num_valid;
  int32_t* error_count;  // nullptr when absent
  // workspace
  int32_t* err;
  int32_t* local;
  int32_t* counts;  // [chunks][E]
  int32_t* start;   // [E + 1]
  int32_t* total;   // [E]
};

__global__ void __launch_bounds__(kScanThreads) local_table_kernel(const Args a) {
  if (threadIdx.x == 0) *a.err = 0;
  int carry = 0;  // kept experts before this tile (mask form)
  for (int64_t base = 0; base < a.Eg; base += kScanThreads) {
    const int64_t g = base + threadIdx.x;
    const bool in = g < a.Eg;
    int local = -1;
    if (a.mask) {
      const int kept = in && a.mask[g] != 0 ? 1 : 0;
      int tile_total = 0;
      const int incl = block_inclusive_sum_1024(kept, &tile_total);
      if (kept) local = carry + incl - 1;
      carry += tile_total;
    } else if (a.map) {
      local = in ? a.map[g] : -1;
    } else {
      local = int(g);
    }
    if (local < 0 || local >= a.E) local = -1;  // device data is not validated: drop what cannot be held
    if (in) a.local[g] = local;
  }
}

// Local expert of entry i, -1 to skip it (-1 id, remote expert, past the end); *bad = id outside
// [-1, Eg).
__device__ __forceinline__ int entry_expert(const Args& a, int64_t i, bool* bad) {
  *bad = false;
  if (i >= a.N) return -1;
  const int32_t g = a.ids[i];
  if (g == -1) return -1;
  if (g < -1 || int64_t(g) >= a.Eg) {
    *bad = true;
    return -1;
  }
  return a.local[g];
}

__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) histogram_kernel(const Args a) {
  extern __shared__ int s_count[];  // [kWarpsPerBlock][E]
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t chunk = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (chunk >= a.chunks) return;  // whole warp leaves together
  int* cnt = s_count + warp * a.E;
  for (int e = lane; e < a.E; e += kWarp) cnt[e] = 0;
  __syncwarp();
  const int64_t first = chunk * a.steps * kWarp;
  int bad_count = 0;
  for (int64_t s = 0; s < a.steps; ++s) {
    bool bad;
    const int e = entry_expert(a, first + s * kWarp + lane, &bad);
    bad_count += __popc(__ballot_sync(0xffffffffu, bad));
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) cnt[e] += __popc(peers);  // one leader per expert
    __syncwarp();
  }
  if (lane == 0 && bad_count > 0) atomicAdd(a.err, bad_count);  // a count: order-independent
  int32_t* row = a.counts + chunk * a.E;
  for (int e = lane; e < a.E; e += kWarp) row[e] = cnt[e];
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(const Args a) {
  const int e = int(threadIdx.x);
  int total = 0;
  if (e < a.E) {
#pragma unroll 8
    for (int64_t c = 0; c < a.chunks; ++c) total += a.counts[c * a.E + e];  // coalesced across e
  }
  const int padded = int((int64_t(total) + a.block_m - 1) / a.block_m * a.block_m);
  int num_valid = 0;
  const int start = block_inclusive_sum_1024(padded, &num_valid) - padded;
  if (e < a.E) {
    a.start[e] = start;
    a.total[e] = total;
    int running = start;
#pragma unroll 8
    for (int64_t c = 0; c < a.chunks; ++c) {
      const int n = a.counts[c * a.E + e];
      a.counts[c * a.E + e] = running;
      running += n;
    }
  }
  if (e == 0) {
    a.start[a.E] = num_valid;
    *a.num_valid = num_valid;
    if (a.error_count) *a.error_count = *a.err;
  }
}

__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) scatter_kernel(const Args a) {
  extern __shared__ int s_offset[];  // [kWarpsPerBlock][E]
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t chunk = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (chunk >= a.chunks) return;  // whole warp leaves together
  int* off = s_offset + warp * a.E;
  const int32_t* row = a.counts + chunk * a.E;
  for (int e = lane; e < a.E; e += kWarp) off[e] = row[e];
  __syncwarp();
  const unsigned lower = (1u << lane) - 1u;
  const int64_t first = chunk * a.steps * kWarp;
  for (int64_t s = 0; s < a.steps; ++s) {
    const int64_t i = first + s * kWarp + lane;
    bool bad;
    const int e = entry_expert(a, i, &bad);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0) {
      const int pos = off[e] + __popc(peers & lower);
      const int32_t t = int32_t(i / a.k), j = int32_t(i % a.k);
      a.out_ids[pos] = a.packed ? ((j << 24) | t) : int32_t(i);
      a.out_w[pos] = a.weights[i];
    }
    __syncwarp();  // every lane has read off[e] before the leader advances it
    if (e >= 0 && lane == __ffs(peers) - 1) off[e] += __popc(peers);
    __syncwarp();
  }
}

// The expert whose run holds position pos (< num_valid): the last e with start[e] <= pos.
__device__ __forceinline__ int run_of(const int32_t* start, int E, int64_t pos) {
  int lo = 0, hi = E;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (start[mid] <= pos) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__global__ void fill_kernel(const Args a) {
  const int64_t num_valid = a.start[a.E];
  const int64_t n = a.max_padded > a.max_blocks ? a.max_padded : a.max_blocks;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (i < a.max_padded) {
      bool pad = i >= num_valid;
      if (!pad) {
        const int e = run_of(a.start, a.E, i);
        pad = i >= int64_t(a.start[e]) + a.total[e];
      }
      if (pad) {
        a.out_ids[i] = a.pad;
        a.out_w[i] = 0.0f;
      }
    }
    if (i < a.max_blocks) {
      const int64_t pos = i * a.block_m;
      a.out_e[i] = pos < num_valid ? run_of(a.start, a.E, pos) : -1;
    }
  }
}

Status supports(const SortTokensParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"topk_ids", &p.topk_ids},
                                         {"topk_weights", &p.topk_weights},
                                         {"expert_mask", &p.expert_mask},
                                         {"expert_map", &p.expert_map},
                                         {"sorted_token_ids", &p.sorted_token_ids},
                                         {"sorted_weights", &p.sorted_weights},
                                         {"sorted_expert_ids", &p.sorted_expert_ids},
                                         {"num_valid", &p.num_valid},
                                         {"error_count", &p.error_count}}));
  if (p.num_experts > kMaxLocalExperts) {
    return Unsupported("sort_tokens_sm90: num_experts must be <= ", kMaxLocalExperts,
                       " (shared-memory counts per warp), got ", p.num_experts);
  }
  return Status::Ok();
}

size_t workspace(const SortTokensParams& p) { return make_plan(p).bytes; }

Status run(const SortTokensParams& p, const RunContext& ctx) {
  const Plan pl = make_plan(p);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < pl.bytes) {
    return InvalidArgument("workspace: sort_tokens_sm90 needs ", pl.bytes, " bytes, got ", ctx.workspace_bytes);
  }
  Args a;
  a.ids = p.topk_ids.ptr<int32_t>();
  a.weights = p.topk_weights.ptr<float>();
  a.mask = p.expert_mask.present() ? p.expert_mask.ptr<int32_t>() : nullptr;
  a.map = p.expert_map.present() ? p.expert_map.ptr<int32_t>() : nullptr;
  a.T = int32_t(p.topk_ids.shape[0]);
  a.k = int32_t(p.topk_ids.shape[1]);
  a.E = p.num_experts;
  a.block_m = p.block_m;
  a.N = pl.N;
  a.Eg = pl.Eg;
  a.steps = pl.steps;
  a.chunks = pl.chunks;
  a.packed = p.encoding == SortEncoding::packed;
  a.pad = a.packed ? int32_t((int64_t(a.k) << 24) | a.T) : int32_t(pl.N);
  a.max_padded = p.sorted_token_ids.shape[0];
  a.max_blocks = p.sorted_expert_ids.shape[0];
  a.out_ids = p.sorted_token_ids.ptr<int32_t>();
  a.out_w = p.sorted_weights.ptr<float>();
  a.out_e = p.sorted_expert_ids.ptr<int32_t>();
  a.num_valid = p.num_valid.ptr<int32_t>();
  a.error_count = p.error_count.present() ? p.error_count.ptr<int32_t>() : nullptr;
  char* ws = static_cast<char*>(ctx.workspace);
  a.err = reinterpret_cast<int32_t*>(ws + pl.off_err);
  a.local = reinterpret_cast<int32_t*>(ws + pl.off_local);
  a.counts = reinterpret_cast<int32_t*>(ws + pl.off_counts);
  a.start = reinterpret_cast<int32_t*>(ws + pl.off_start);
  a.total = reinterpret_cast<int32_t*>(ws + pl.off_total);

  auto stream = static_cast<cudaStream_t>(ctx.stream);
  local_table_kernel<<<1, kScanThreads, 0, stream>>>(a);
  MOEKIT_RETURN_IF_ERROR(last_launch("sort_tokens_sm90: local_table"));
  const int warp_grid = ceil_div(pl.chunks, kWarpsPerBlock);
  const size_t warp_smem = size_t(kWarpsPerBlock) * size_t(a.E) * sizeof(int);
  if (pl.chunks > 0) {
    histogram_kernel<<<warp_grid, kWarp * kWarpsPerBlock, warp_smem, stream>>>(a);
    MOEKIT_RETURN_IF_ERROR(last_launch("sort_tokens_sm90: histogram"));
  }
  scan_kernel<<<1, kScanThreads, 0, stream>>>(a);
  MOEKIT_RETURN_IF_ERROR(last_launch("sort_tokens_sm90: scan"));
  if (pl.chunks > 0) {
    scatter_kernel<<<warp_grid, kWarp * kWarpsPerBlock, warp_smem, stream>>>(a);
    MOEKIT_RETURN_IF_ERROR(last_launch("sort_tokens_sm90: scatter"));
  }
  const int64_t n = a.max_padded > a.max_blocks ? a.max_padded : a.max_blocks;
  if (n > 0) {
    constexpr int kFillThreads = 256;
    const int64_t blocks = (n + kFillThreads - 1) / kFillThreads;
    fill_kernel<<<int(blocks < 4096 ? blocks : 4096), kFillThreads, 0, stream>>>(a);
    MOEKIT_RETURN_IF_ERROR(last_launch("sort_tokens_sm90: fill"));
  }
  return Status::Ok();
}

}  // namespace

void register_sort_tokens_sm90(Registry& r) {
  r.add({"sort_tokens_sm90", OpKind::sort_tokens, MoeVariant::none, Backend::cuda,
         "topk_ids i32, topk_weights f32 -> i32 ids (packed|flat), f32 weights copied; E <= 1024", 100,
         erase_supports<SortTokensParams, supports>, erase_workspace<SortTokensParams, workspace>,
         erase_run<SortTokensParams, run>});
}

}  // namespace moekit::cuda
