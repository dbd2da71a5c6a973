// Expert parallelism (EP): the experts of an MoE layer split over `world` ranks (GPUs), each rank
// holding a contiguous block of Eg / world experts. One EP step, for every rank r at once:
//   1. plan     : from every rank's routing (topk_ids, global expert ids) the tokens r sends to each
//                 rank d -- a token goes once to each rank that owns at least one of its k experts,
//                 with its whole id / weight rows (ids of other ranks' experts become remote there);
//   2. dispatch : all-to-all of those x rows, id rows and weight rows (NCCL grouped send / recv);
//   3. experts  : fused_moe on the received rows with the expert_map of rank d (global -> local id,
//                 -1 = another rank's expert), giving one partial output row per received row;
//   4. combine  : all-to-all of the partial rows back to their source ranks, then
//                 out[t] = round(sum over d ascending of partial(t, d)) in f32 -- deterministic.
// The result equals the single-GPU fused_moe up to one extra rounding of each partial row to x's
// dtype (tests/test_ep.cpp compares within the bf16 tolerance).
//
// The plan and a host simulation of the whole step (every rank in one process, host tensors, the
// registry's host fused_moe kernels) are plain C++ and run everywhere; the NCCL runner (Group,
// run) needs the CUDA backend built with NCCL (MOEKIT_WITH_NCCL) and one GPU per rank in this
// process.
// Weights may be unquantized (x's dtype) or fp8 (w1_scale / w2_scale per rank and the block sizes
// of Options, exactly as FusedMoeParams takes them). With Options::fp8_dispatch the x rows travel
// as fp8 e4m3fn codes plus one f32 scale per row (amax / 448, the dynamic per-token scheme of SPEC
// 5), halving the dispatch bytes of bf16; the receiver decodes them to x's dtype.
// NOTE: v1 plans on the host: `run` copies the routing to the host (one synchronisation per step)
// to size the all-to-all; it is therefore not CUDA-graph capturable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"
#include "moekit/ops/fused_moe.h"

namespace moekit::ep {

// The routing bookkeeping of one EP step (pure host data).
struct Plan {
  int world = 0;                 // ranks
  int Eg = 0;                    // global experts (Eg % world == 0)
  int k = 0;                     // experts per token
  int experts_per_rank = 0;      // Eg / world; rank of expert g = g / experts_per_rank
  std::vector<int64_t> tokens;   // [world] tokens T_s of each source rank
  std::vector<int64_t> count;    // [world * world] count[s * world + d]: rows s sends to d
  // [world] for source s: the token of each send row, grouped by destination d ascending, tokens
  // ascending inside a group (row send_offset(s, d) + i is the i-th token s sends to d).
  std::vector<std::vector<int32_t>> send_token;
  // [world] for source s: [T_s * world] the send row of (t, d), -1 when t sends nothing to d.
  std::vector<std::vector<int32_t>> combine_row;

  int64_t sends(int s) const;                 // rows s sends (all destinations)
  int64_t recvs(int d) const;                 // rows d receives (all sources)
  int64_t send_offset(int s, int d) const;    // first send row of s for d
  int64_t recv_offset(int d, int s) const;    // first receive row of d from s (sources ascending)
};

// Plans from every rank's routing: ids[s] is rank s's topk_ids, host, [tokens[s], k] i32
// contiguous, ids in [-1, Eg) (-1 = unused slot). Errors (before anything is written): world < 1,
// Eg % world != 0, k < 1, sizes that differ, an id out of range (names the rank, token and slot).
Status make_plan(int world, int Eg, int k, const std::vector<const int32_t*>& ids,
                 const std::vector<int64_t>& tokens, Plan* plan);

// One rank's tensors. x [T, H], topk_ids [T, k] (global ids), topk_weights [T, k] f32, out [T, H];
// w1 [Eg / world, N1, H] and w2 [Eg / world, H, I]: this rank's experts, local index = global id -
// rank * Eg / world. All contiguous; x and out of one dtype (bf16, f16 or f32); w1, w2 of x's
// dtype or both fp8_e4m3fn with their scales.
struct RankInputs {
  TensorView x, topk_ids, topk_weights, w1, w2, out;
  TensorView w1_scale, w2_scale;  // fp8 weights only: this rank's experts' scales (FusedMoeParams)
};

struct Options {
  Activation activation = Activation::silu;
  bool round_intermediate = true;  // as FusedMoeParams::round_intermediate
  bool weight_on_input = false;    // as FusedMoeParams::weight_on_input (Llama-4; k == 1)
  int scale_block_n = 0;           // fp8 block-scaled weights: as FusedMoeParams
  int scale_block_k = 0;
  bool fp8_dispatch = false;       // send x rows as e4m3fn + one f32 scale per row (see the top)
};

// The per-row fp8 code of x rows for fp8_dispatch (shared by the host simulation and the tests):
// scale = amax(row) / 448 (1 when the row is all zeros), code = e4m3fn(v / scale), decoded value =
// code * scale rounded to x's dtype.
constexpr float kFp8DispatchMax = 448.0f;

// Checks the ranks' tensors against each other and the plan's rules (shapes, dtypes, devices:
// all host for simulate_host, all on distinct CUDA devices for run). Names rank and argument.
Status validate(const std::vector<RankInputs>& ranks, int Eg, bool on_device);

// The whole EP step in one process on host tensors (the single-process multi-rank simulation):
// the same plan, dispatch order, expert maps and combine order as `run`, with the data moved by
// host copies and the experts run by the registry's host fused_moe kernel.
Status simulate_host(const std::vector<RankInputs>& ranks, int Eg, const Options& opts = {});

// ---------------------------------------------------------------- NCCL runner (CUDA + NCCL builds)
// True when this build has the NCCL runner.
bool nccl_available();

// One NCCL communicator per GPU of this process (ncclCommInitAll), rank r = devices[r], a stream
// per rank, and workspace buffers that grow to the largest step seen.
class Group {
 public:
  virtual ~Group() = default;
  virtual int world() const = 0;
  virtual int device(int rank) const = 0;
  virtual void* stream(int rank) const = 0;  // cudaStream_t of the rank (the step runs on it)
};
Status create_group(const std::vector<int>& devices, std::unique_ptr<Group>* out);

// Per-phase GPU times of one step, the maximum over ranks (CUDA events on each rank's stream),
// milliseconds; plan_ms is host time (routing copy + plan + index upload).
struct PhaseTimes {
  double plan_ms = 0, dispatch_ms = 0, experts_ms = 0, combine_ms = 0, total_ms = 0;
};

// The EP step on the group's GPUs: ranks[r]'s tensors live on device(r). Returns after every
// rank's stream finished (the host plan synchronises anyway). times may be null.
Status run(Group& group, const std::vector<RankInputs>& ranks, int Eg, const Options& opts = {},
           PhaseTimes* times = nullptr);

// `moekit bench --ep N`: random bf16 inputs for the shape (Eg experts split over the devices, k
// distinct uniformly random experts per token, tokens_per_rank tokens on every rank), warmup +
// iters steps of `run` with opts; per-phase medians over the steps.
struct BenchResult {
  PhaseTimes median;
  double dispatch_bytes = 0;  // x-row bytes sent by all ranks in one dispatch (fp8: codes + scales)
  int iters = 0;
};
Status bench(const std::vector<int>& devices, int Eg, int k, int64_t H, int64_t I, int64_t tokens_per_rank, int warmup,
             int iters, const Options& opts, BenchResult* out);

}  // namespace moekit::ep
