// moekit testing harness: problem generators, error metrics, model presets and the per-op check /
// bench hooks shared by the unit tests (tests/), `moekit check` and `moekit bench`, so a
// benchmarked shape is always a tested shape (library target moekit_testing, not installed).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/core/tensor_view.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit::testing {

// ---------------------------------------------------------------- buffers and random data
// An owning host buffer with a contiguous view.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;  // contiguous over `bytes`, device cpu

  Buffer() = default;
  Buffer(DType dtype, std::initializer_list<int64_t> shape);
  Buffer(DType dtype, const std::vector<int64_t>& shape);
  Buffer(const Buffer& o);
  Buffer& operator=(const Buffer& o);
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  int64_t numel() const { return view.numel(); }
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  float get(int64_t i) const { return load_as_f32(bytes.data(), view.dtype, i); }
  void set(int64_t i, float v) { store_from_f32(bytes.data(), view.dtype, i, v); }
  void fill_bytes(unsigned char b);  // e.g. 0xAB to poison outputs
};

// Deterministic generator (std::mt19937_64 seeded by the caller).
struct Rng {
  explicit Rng(uint64_t seed) : gen(seed) {}
  std::mt19937_64 gen;
  float uniform(float lo, float hi);
  float normal(float mean, float stddev);
  int64_t integer(int64_t lo, int64_t hi);  // inclusive
  // Fills a floating buffer with normal(0, stddev) values, rounded to its dtype.
  void fill_normal(Buffer& b, float stddev);
  void fill_uniform(Buffer& b, float lo, float hi);
};

// ---------------------------------------------------------------- device mirroring
// Moves a problem's tensors to the device of a kernel's backend and its outputs back, through the
// backend's DeviceOps (registry.h); a no-op for host backends. Frees everything it allocated.
class DeviceMirror {
 public:
  explicit DeviceMirror(Backend b);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  bool on_device() const { return ops_ != nullptr; }
  // Replaces the host view *t by a device copy of its whole strided extent (absent views and
  // host backends: unchanged).
  Status input(TensorView* t);
  // Same, and copy_back() later writes the device contents back into the host view's memory. The
  // device copy starts equal to the host bytes, so poison / row padding checks still see them.
  Status output(TensorView* t);
  // `bytes` of scratch on the device (host backends: *out = nullptr).
  Status scratch(size_t bytes, void** out);
  Status copy_back();

 private:
  struct Out {
    void* host;
    void* dev;
    size_t bytes;
  };
  const DeviceOps* ops_ = nullptr;
  Backend backend_;
  std::vector<void*> allocs_;
  std::vector<Out> outs_;
};
// Bytes spanned by a strided view (0 when empty).
size_t extent_bytes(const TensorView& t);

// ---------------------------------------------------------------- metrics
struct Metrics {
  int64_t count = 0;        // elements compared
  int64_t mismatches = 0;   // elements outside tolerance (or unequal, for exact compares)
  double max_abs_err = 0;
  double max_rel_err = 0;   // |a-b| / max(|b|, rel_floor)
  double cosine = 1;        // cosine similarity of the two tensors as vectors
  double rms_ratio = 1;     // rms(actual) / rms(expected)
  bool finite = true;       // actual has no NaN/Inf where expected is finite
  std::string worst;        // coordinates and values of the worst element
};

// Elementwise compare of `actual` against `expected` (same numel) with |a-b| <= atol + rtol*|b|.
// `dims` (optional) turns flat indices into coordinates in Metrics::worst.
Metrics compare_close(const std::vector<double>& actual, const std::vector<double>& expected,
                      double atol, double rtol, const std::vector<int64_t>& dims = {});
// Exact compare of integer outputs.
Metrics compare_exact(const std::vector<int64_t>& actual, const std::vector<int64_t>& expected,
                      const std::vector<int64_t>& dims = {});
// Reads every element of a host buffer view as double.
std::vector<double> to_doubles(const TensorView& t);
std::vector<int64_t> to_ints(const TensorView& t);

// ---------------------------------------------------------------- presets and requests
enum class Scheme : uint8_t { bf16, f16, f32, fp8_tensor, fp8_channel, fp8_block };
const char* scheme_name(Scheme s);
bool parse_scheme(const std::string& s, Scheme* out);

enum class Routing : uint8_t { softmax_topk, grouped_topk, sigmoid_topk };

struct ModelPreset {
  const char* name;       // "mixtral", "deepseek-v3", "llama4", "qwen3-moe"
  int64_t E, k, H, I;     // real dimensions (SPEC 7)
  int64_t small_H, small_I;  // scaled-down default (multiples of 128)
  Routing routing;
  int n_group, topk_group;
  bool renormalize;
  float rsf;
  bool weight_on_input;
  Scheme scheme;          // the scheme the real checkpoint uses
};
const std::vector<ModelPreset>& model_presets();
const ModelPreset* find_preset(const std::string& name);

// A problem shape as the CLI flags give it. Unset (-1) fields come from the preset or defaults.
struct ShapeRequest {
  std::string model;      // preset name or "" (custom: experts/topk/hidden/inter)
  int64_t experts = -1, topk = -1, hidden = -1, inter = -1;
  bool full = false;      // preset at real dimensions instead of the scaled-down default
  Scheme scheme = Scheme::bf16;
  bool scheme_given = false;
  Activation activation = Activation::silu;
  bool weight_on_input = false;
  uint64_t seed = 1;
};

// Resolved dimensions of a fused-MoE problem.
struct MoeShape {
  std::string label;      // e.g. "mixtral-small"
  int64_t T = 1, E = 8, k = 2, H = 256, I = 256;
  bool g1u1 = true;
  Scheme scheme = Scheme::bf16;
  Activation activation = Activation::silu;
  bool weight_on_input = false;
  Routing routing = Routing::softmax_topk;
  int n_group = 1, topk_group = 1;
  bool renormalize = true;
  float rsf = 1.0f;
};
// Fills a MoeShape from a request and a token count; returns an error for bad combinations.
Status resolve_shape(const ShapeRequest& req, int64_t tokens, MoeShape* out);

// ---------------------------------------------------------------- per-op hooks
struct CaseResult {
  std::string op, kernel, backend, name;  // name: case label, e.g. "edge:T=0" or "mixtral-small T=8"
  bool ok = false;
  std::string reference;  // what it was compared with: "ref" or "oracle"
  std::string detail;     // failure reason / tolerance used
  Metrics metrics;
};

struct CheckRequest {
  ShapeRequest shape;
  std::vector<int64_t> tokens;  // token counts to run (empty = op's defaults)
  bool has_backend = false;     // restrict to kernels of this backend
  Backend backend = Backend::ref;
  bool edge_cases = true;       // also run the op's named edge cases
  // fused_moe: configs (RunOptions::config names) the variant's first kernel that takes configs also
  // runs besides its rules, one result each labelled kernel_config_label(); {"all"}: every config it
  // can run for the case.
  std::vector<std::string> configs;
};

// "kernel [config]", the CaseResult::kernel of a kernel run with an explicit config ("kernel" alone
// without one); split_kernel_label undoes it.
std::string kernel_config_label(const std::string& kernel, const std::string& config);
void split_kernel_label(const std::string& label, std::string* kernel, std::string* config);

// One prepared benchmark problem: owns its data, run() launches the kernel once.
//
// Device problems (the kernel's backend has DeviceOps, i.e. cuda) set `sets` > 0: the hook made that
// many input sets resident on the device (weights and inputs; sets share no memory) and
// launch(stream, s) enqueues the whole op on set s on `stream` without synchronising, which the
// bench captures into one CUDA graph per set (DeviceOps::time_graph). `moekit bench` then times
// launch(), never run(). Host problems keep sets = 0 and are timed through run().
struct BenchProblem {
  virtual ~BenchProblem() = default;
  virtual Status run() = 0;
  std::string shape;      // human-readable shape
  double flops = 0;       // useful flops of one run
  double bytes = 0;       // bytes that must move (memory floor numerator)

  int sets = 0;           // device input sets (0 = host problem)
  std::string kernel_chosen;  // device problems: the kernel the op's dispatch picks for set 0 when
                              //   no kernel is forced (empty = not determined)
  virtual Status launch(void* stream, int set) {
    (void)stream;
    (void)set;
    return Unsupported("this benchmark problem has no device launch");
  }
  // fused_moe device problems of a kernel that takes configs: the configs it can run here, its own
  // pick first (empty otherwise); set_config makes launch() run one (workspace grown as needed).
  std::vector<std::string> configs;
  virtual Status set_config(const std::string& config) {
    (void)config;
    return Unsupported("this benchmark problem takes no config");
  }
  // Median time in us of the op's unfused baseline on the same device sets (fused_moe: the cuBLAS
  // path of src/cuda/moe_baseline_cublas.h), timed like launch() with the L2 flush `l2` (the one the
  // kernel rows were timed with); unsupported when there is none.
  virtual Status baseline(int warmup, int iters, L2Flush l2, double* median_us) {
    (void)warmup;
    (void)iters;
    (void)l2;
    (void)median_us;
    return Unsupported("no baseline for this problem");
  }
  // Median time in us of a kernel that only reads the bytes the op must read (fused_moe: the touched
  // experts' w1 and w2), timed like launch() with the L2 flush `l2`: the memory ceiling of the same
  // harness (src/cuda/weight_stream.h); unsupported when there is none.
  virtual Status stream(int warmup, int iters, L2Flush l2, double* median_us) {
    (void)warmup;
    (void)iters;
    (void)l2;
    (void)median_us;
    return Unsupported("no weight stream for this problem");
  }
};

struct BenchRequest {
  ShapeRequest shape;
  bool row_major_weights = false;  // fused_moe, CPU kernels: do not pack the weights at setup
};

struct OpHarness {
  OpKind op;
  // Every case of this op: the reference kernel against the independent oracle, and every other
  // registered kernel (filtered by backend) against the reference.
  std::vector<CaseResult> (*check)(const CheckRequest& req);
  // Prepares a problem of `tokens` tokens for kernel k (nullptr when the op is not benchmarkable).
  Status (*prepare_bench)(const BenchRequest& req, int64_t tokens, const Kernel& k,
                          std::unique_ptr<BenchProblem>* out);
  // Whether kernel k computes the problem `req` describes at all (e.g. a fused_moe kernel of
  // another variant does not); nullptr = every kernel of the op. The bench lists only those.
  bool (*bench_applies)(const BenchRequest& req, const Kernel& k) = nullptr;
};
const std::vector<OpHarness>& op_harnesses();
const OpHarness* find_harness(OpKind op);

// The per-op hooks (src/testing/check_<op>.cpp).
std::vector<CaseResult> check_topk_softmax(const CheckRequest& req);
std::vector<CaseResult> check_grouped_topk(const CheckRequest& req);
std::vector<CaseResult> check_sigmoid_topk(const CheckRequest& req);
std::vector<CaseResult> check_sort_tokens(const CheckRequest& req);
std::vector<CaseResult> check_shuffle_weight(const CheckRequest& req);
std::vector<CaseResult> check_unshuffle_weight(const CheckRequest& req);
std::vector<CaseResult> check_quantize_fp8(const CheckRequest& req);
std::vector<CaseResult> check_convert_fp8(const CheckRequest& req);
std::vector<CaseResult> check_pack_weight(const CheckRequest& req);    // check_pack_weight.cpp
std::vector<CaseResult> check_unpack_weight(const CheckRequest& req);
std::vector<CaseResult> check_fused_moe(const CheckRequest& req);

Status bench_topk_softmax(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_grouped_topk(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_sigmoid_topk(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_sort_tokens(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_fused_moe(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
// Layout and quantization ops (bench_layout_quant.cpp): host kernels only.
Status bench_quantize_fp8(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_convert_fp8(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_shuffle_weight(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_unshuffle_weight(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_pack_weight(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
Status bench_unpack_weight(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*);
bool bench_applies_fused_moe(const BenchRequest& req, const Kernel& k);
// Replaces the problem's bf16/f16 w1 and w2 by their pack_weight(cpu_vnni2_n32) copies (the CPU
// bf16 kernel's packed layout); an error (problem unchanged) when the weights cannot be packed.
// Defined in check_fused_moe.cpp.
struct MoeProblem;
Status pack_moe_weights(MoeProblem* p);

// Kernels of `op` that a check should run, given the backend filter.
std::vector<const Kernel*> kernels_to_check(OpKind op, const CheckRequest& req);

}  // namespace moekit::testing
