// moekit/registry.h: the kernel registry and the dispatch rule of SPEC 6.
//
// A kernel is one table row: name, op, variant, backend, dtype recipe, priority, and three
// functions: supports(params) -> ok or the reason it refuses, workspace_bytes(params) and
// run(params, context). Params are passed type-erased (const void*) and are always the op's own
// Params struct (moekit/ops/*.h). Backends add their rows in register_<backend>_kernels(); the
// registry is built once, on first use, in src/ops/dispatch.cpp.
//
// Selection, for one call (first rule that applies wins):
//   1. RunOptions::kernel (explicit argument): that kernel or an error.
//   2. MOEKIT_FORCE_KERNEL: a kernel of this op named there; an error if it refuses the problem.
//   3. MOEKIT_BACKEND (auto | ref | cpu | cuda): only kernels of that backend are candidates.
//   4. the highest-priority available candidate whose supports() accepts the problem.
// When nothing accepts the problem the error lists every candidate and its reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/core/status.h"

namespace moekit {

struct Config;

enum class Backend : uint8_t { ref, cpu, cuda };
constexpr int kNumBackends = 3;
const char* backend_name(Backend b);
bool parse_backend(const std::string& s, Backend* out);

// Every public operator (the stem used in file names, tests and bench labels).
enum class OpKind : uint8_t {
  topk_softmax,
  grouped_topk,
  sigmoid_topk,
  sort_tokens,
  shuffle_weight,
  unshuffle_weight,
  quantize_fp8,
  convert_fp8,
  fused_moe,
  pack_weight,
  unpack_weight,
};
constexpr int kNumOps = 11;
const char* op_name(OpKind op);
bool parse_op(const std::string& s, OpKind* out);

// fused_moe variants in SPEC 6 order; other ops use `none`.
enum class MoeVariant : uint8_t { none, fp8_block, fp8_row_tkw1, fp8_row, unquantized };
const char* variant_name(MoeVariant v);

// Per-call options every front door takes.
struct RunOptions {
  const char* kernel = nullptr;   // explicit kernel name; overrides the environment
  void* stream = nullptr;         // cudaStream_t for CUDA kernels (nullptr = default stream)
  void* workspace = nullptr;      // caller workspace (see <op>_workspace_size); may be null for
  size_t workspace_bytes = 0;     //   host kernels, which then get a front-door allocation
  bool deterministic = false;     // fixed-order reductions (also on with MOEKIT_DETERMINISTIC=1)
  // fused_moe: an explicit config of the kernels that take one (the CUDA sm90 rows; names and rules in
  // docs/fused_moe_configs.md), e.g. "grouped/64x256.ring5+k2"; overrides MOEKIT_FUSED_MOE_CONFIG and
  // restricts the choice to those kernels. nullptr or "" = the kernels' own rules.
  const char* config = nullptr;
};

// What a kernel's run() receives besides its params.
struct RunContext {
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool deterministic = false;
};

struct Kernel {
  const char* name;     // unique; used unchanged as file stem / test id / bench label
  OpKind op;
  MoeVariant variant;   // fused_moe only; `none` otherwise
  Backend backend;
  const char* recipe;   // dtype recipe, e.g. "x bf16|f16|f32, w same, f32 accumulate"
  int priority;         // higher wins among kernels that accept a problem
  Status (*supports)(const void* params);
  size_t (*workspace_bytes)(const void* params);  // nullptr = needs none
  Status (*run)(const void* params, const RunContext& ctx);
  // fused_moe: variants served besides `variant`, a bit (1 << MoeVariant) each; one row can serve the
  // router weight on the output and on the input, for instance.
  uint8_t more_variants = 0;
  // fused_moe: whether the kernel runs explicit configs (RunOptions::config), and the configs it can
  // run for a problem (first the one its rules pick); nullptr when it takes none.
  std::vector<std::string> (*configs)(const void* params) = nullptr;

  bool serves(MoeVariant v) const { return variant == v || (more_variants >> unsigned(v)) & 1u; }
};

constexpr uint8_t variant_bit(MoeVariant v) { return uint8_t(1u << unsigned(v)); }

// Adapters so kernel files can write typed functions.
template <class P, Status (*F)(const P&)>
Status erase_supports(const void* p) {
  return F(*static_cast<const P*>(p));
}
template <class P, size_t (*F)(const P&)>
size_t erase_workspace(const void* p) {
  return F(*static_cast<const P*>(p));
}
template <class P, Status (*F)(const P&, const RunContext&)>
Status erase_run(const void* p, const RunContext& ctx) {
  return F(*static_cast<const P*>(p), ctx);
}

// Memory and timing operations of a device backend (the CUDA backend registers them), so front ends
// and tests move data and time device work without including device headers. All synchronous
// unless stated: copy_to_device's data is on the device for every stream when it returns;
// copy_to_host does not wait for work on other streams (synchronize them first).
// What DeviceOps::time_graph does to the device's L2 before each timed replay (docs/cli.md, "How CUDA
// rows are measured"): none; write: a write of max(2 x L2, 128 MiB) of scratch (evicts every line the
// previous replay left, and leaves the L2 full of dirty lines that the replay then writes back, as the
// peer's harness does); clean: that write, then a read of a second buffer of the same size, so the
// replay starts with clean lines (no write-back in the timed region).
enum class L2Flush : uint8_t { none, write, clean };

struct DeviceOps {
  Status (*alloc)(size_t bytes, void** out);
  void (*free)(void* p);
  Status (*copy_to_device)(void* dst, const void* src, size_t bytes);
  Status (*copy_to_host)(void* dst, const void* src, size_t bytes);
  Status (*memset)(void* dst, int value, size_t bytes);
  Status (*synchronize)();
  // Short description of the device ("NVIDIA H200, 132 SMs, 60 MiB L2, sm_90").
  std::string (*describe)();
  // Device timing by CUDA-graph replay (src/cuda/cuda_timing.cu; docs/cli.md "How CUDA rows are
  // measured"). Runs launch(stream, s) once per input set s in [0, sets) eagerly (errors surface
  // outside capture), captures each into a graph on a non-default stream, replays every graph
  // `warmup` times, then takes `iters` samples: replay i uses graph i % sets, preceded (outside the
  // timed region) by the L2 flush `flush` (L2Flush). Each sample is the
  // event-timed duration of one replay in microseconds; all are appended to *us in order. launch
  // must enqueue work only on `stream` (a cudaStream_t), without synchronising or allocating; a
  // capture failure is an error naming `what` (the op / kernel) and the input set.
  Status (*time_graph)(const std::function<Status(void* stream, int set)>& launch, int sets, int warmup,
                       int iters, L2Flush flush, const char* what, std::vector<double>* us);
  // Free and total bytes of the current device (cudaMemGetInfo); nullptr when the backend cannot
  // say. `moekit check` / `bench` refuse a request that cannot fit before allocating anything.
  Status (*mem_info)(size_t* free_bytes, size_t* total_bytes) = nullptr;
};

class Registry {
 public:
  void add(const Kernel& k);
  // Availability of a whole backend (e.g. "no CUDA device", "CPU lacks avx512bf16").
  void set_backend_probe(Backend b, Status (*probe)());
  Status backend_available(Backend b) const;
  void set_device_ops(Backend b, const DeviceOps* ops);
  const DeviceOps* device_ops(Backend b) const;  // nullptr for host backends

  const std::vector<Kernel>& kernels() const { return kernels_; }
  const Kernel* find(const std::string& name) const;
  std::vector<const Kernel*> candidates(OpKind op, MoeVariant variant) const;

  // The dispatch rule above. `shape_key` is a short description of the problem used by
  // MOEKIT_PRINT_DISPATCH to print each (op, shape) choice once.
  Status select(OpKind op, MoeVariant variant, const void* params, const RunOptions& opts,
                const std::string& shape_key, const Kernel** out) const;
  // Same rule with an explicit configuration instead of the process environment (for tests).
  Status select_with(const Config& cfg, OpKind op, MoeVariant variant, const void* params,
                     const RunOptions& opts, const std::string& shape_key, const Kernel** out) const;

 private:
  std::vector<Kernel> kernels_;
  Status (*probes_[kNumBackends])() = {nullptr, nullptr, nullptr};
  const DeviceOps* device_ops_[kNumBackends] = {nullptr, nullptr, nullptr};
};

// The process-wide registry with every compiled backend registered.
const Registry& registry();

// Selects a kernel and runs it: allocates a host workspace when the kernel needs one and the caller
// gave none (host backends only), checks a caller workspace's size. Used by every front door.
Status dispatch(OpKind op, MoeVariant variant, const void* params, const RunOptions& opts,
                const std::string& shape_key);
// Workspace bytes the kernel selected for these params/options needs.
Status dispatch_workspace_size(OpKind op, MoeVariant variant, const void* params,
                               const RunOptions& opts, const std::string& shape_key, size_t* bytes);

}  // namespace moekit
