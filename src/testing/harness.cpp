// Buffers, random data, metrics, presets and the op-hook table (src/testing/harness.h).
#include "testing/harness.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace moekit::testing {

std::string kernel_config_label(const std::string& kernel, const std::string& config) {
  return config.empty() ? kernel : kernel + " [" + config + "]";
}

void split_kernel_label(const std::string& label, std::string* kernel, std::string* config) {
  const size_t open = label.find(" [");
  const bool has = open != std::string::npos && !label.empty() && label.back() == ']';
  *kernel = has ? label.substr(0, open) : label;
  *config = has ? label.substr(open + 2, label.size() - open - 3) : std::string();
}

// ---------------------------------------------------------------- Buffer
Buffer::Buffer(DType dtype, std::initializer_list<int64_t> shape)
    : Buffer(dtype, std::vector<int64_t>(shape)) {}

Buffer::Buffer(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  bytes.assign(size_t(n * dtype_size(dtype)) + 1, 0);  // +1: never a null data() for T = 0
  view = TensorView::contiguous(bytes.data(), dtype, int(shape.size()), shape.data());
}

Buffer::Buffer(const Buffer& o) : bytes(o.bytes), view(o.view) { view.data = bytes.data(); }

Buffer& Buffer::operator=(const Buffer& o) {
  if (this != &o) {
    bytes = o.bytes;
    view = o.view;
    view.data = bytes.data();
  }
  return *this;
}

void Buffer::fill_bytes(unsigned char b) { std::memset(bytes.data(), b, bytes.size()); }

// ---------------------------------------------------------------- DeviceMirror
size_t extent_bytes(const TensorView& t) {
  if (!t.present() || t.numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.stride[i];
  return size_t(last + 1) * size_t(dtype_size(t.dtype));
}

DeviceMirror::DeviceMirror(Backend b) : ops_(registry().device_ops(b)), backend_(b) {}

DeviceMirror::~DeviceMirror() {
  for (void* p : allocs_) ops_->free(p);
}

Status DeviceMirror::input(TensorView* t) {
  if (ops_ == nullptr || !t->present() || t->device != Device::cpu) return Status::Ok();
  const size_t bytes = extent_bytes(*t);
  void* dev = nullptr;
  if (bytes > 0) {
    MOEKIT_RETURN_IF_ERROR(ops_->alloc(bytes, &dev));
    allocs_.push_back(dev);
    MOEKIT_RETURN_IF_ERROR(ops_->copy_to_device(dev, t->data, bytes));
  }
  t->data = dev;
  t->device = backend_ == Backend::cuda ? Device::cuda : t->device;
  return Status::Ok();
}

Status DeviceMirror::output(TensorView* t) {
  void* host = t->data;
  MOEKIT_RETURN_IF_ERROR(input(t));
  if (ops_ != nullptr && t->data != host) outs_.push_back({host, t->data, extent_bytes(*t)});
  return Status::Ok();
}

Status DeviceMirror::scratch(size_t bytes, void** out) {
  *out = nullptr;
  if (ops_ == nullptr || bytes == 0) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(ops_->alloc(bytes, out));
  allocs_.push_back(*out);
  return Status::Ok();
}

Status DeviceMirror::copy_back() {
  if (ops_ == nullptr) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(ops_->synchronize());
  for (const Out& o : outs_) MOEKIT_RETURN_IF_ERROR(ops_->copy_to_host(o.host, o.dev, o.bytes));
  return Status::Ok();
}

// ---------------------------------------------------------------- Rng
float Rng::uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
float Rng::normal(float mean, float stddev) { return std::normal_distribution<float>(mean, stddev)(gen); }
int64_t Rng::integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
void Rng::fill_normal(Buffer& b, float stddev) {
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, normal(0.0f, stddev));
}
void Rng::fill_uniform(Buffer& b, float lo, float hi) {
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, uniform(lo, hi));
}

// ---------------------------------------------------------------- metrics
namespace {
std::string coords(int64_t flat, const std::vector<int64_t>& dims) {
  std::ostringstream os;
  if (dims.empty()) {
    os << '[' << flat << ']';
    return os.str();
  }
  std::vector<int64_t> c(dims.size());
  for (int i = int(dims.size()) - 1; i >= 0; --i) {
    const int64_t d = dims[size_t(i)] > 0 ? dims[size_t(i)] : 1;
    c[size_t(i)] = flat % d;
    flat /= d;
  }
  os << '[';
  for (size_t i = 0; i < c.size(); ++i) os << (i ? ", " : "") << c[i];
  os << ']';
  return os.str();
}
}  // namespace

Metrics compare_close(const std::vector<double>& actual, const std::vector<double>& expected,
                      double atol, double rtol, const std::vector<int64_t>& dims) {
  Metrics m;
  m.count = int64_t(expected.size());
  if (actual.size() != expected.size()) {
    m.mismatches = m.count;
    m.worst = "size mismatch";
    return m;
  }
  double dot = 0, na = 0, ne = 0;
  double worst_excess = -INFINITY;  // err - tol of the element closest to (or furthest past) its bound
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isfinite(e) && !std::isfinite(a)) m.finite = false;
    const bool both_nan = std::isnan(a) && std::isnan(e);
    const double err = both_nan ? 0.0 : std::fabs(a - e);
    const double tol = atol + rtol * std::fabs(e);
    const bool bad = !both_nan && !(err <= tol);
    if (bad) ++m.mismatches;
    if (!both_nan && std::isfinite(err)) {
      m.max_abs_err = std::max(m.max_abs_err, err);
      m.max_rel_err = std::max(m.max_rel_err, err / std::max(std::fabs(e), 1e-6));
    }
    // NOTE: ranking by err - tol names the element closest to failing even when all pass.
    const double excess = both_nan ? -INFINITY : (std::isfinite(err) ? err - tol : INFINITY);
    if (excess > worst_excess) {
      worst_excess = excess;
      std::ostringstream os;
      os << coords(int64_t(i), dims) << " actual " << a << " expected " << e;
      m.worst = os.str();
    }
    if (std::isfinite(a) && std::isfinite(e)) {
      dot += a * e;
      na += a * a;
      ne += e * e;
    }
  }
  m.cosine = (na == 0 && ne == 0) ? 1.0 : (na == 0 || ne == 0 ? 0.0 : dot / std::sqrt(na * ne));
  m.rms_ratio = ne == 0 ? (na == 0 ? 1.0 : INFINITY) : std::sqrt(na / ne);
  return m;
}

Metrics compare_exact(const std::vector<int64_t>& actual, const std::vector<int64_t>& expected,
                      const std::vector<int64_t>& dims) {
  Metrics m;
  m.count = int64_t(expected.size());
  if (actual.size() != expected.size()) {
    m.mismatches = m.count;
    m.worst = "size mismatch";
    return m;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (actual[i] != expected[i]) {
      if (m.mismatches++ == 0) {
        std::ostringstream os;
        os << "first mismatch at " << coords(int64_t(i), dims) << ": actual " << actual[i] << " expected "
           << expected[i];
        m.worst = os.str();
      }
      m.max_abs_err = std::max(m.max_abs_err, double(std::llabs(actual[i] - expected[i])));
    }
  }
  return m;
}

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = load_as_f32(t.data, t.dtype, i);
  return v;
}

std::vector<int64_t> to_ints(const TensorView& t) {
  std::vector<int64_t> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = static_cast<const int32_t*>(t.data)[i];
  return v;
}

// ---------------------------------------------------------------- schemes and presets
const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::bf16: return "bf16";
    case Scheme::f16: return "f16";
    case Scheme::f32: return "f32";
    case Scheme::fp8_tensor: return "fp8_tensor";
    case Scheme::fp8_channel: return "fp8_channel";
    case Scheme::fp8_block: return "fp8_block";
  }
  return "?";
}

bool parse_scheme(const std::string& s, Scheme* out) {
  for (Scheme c : {Scheme::bf16, Scheme::f16, Scheme::f32, Scheme::fp8_tensor, Scheme::fp8_channel,
                   Scheme::fp8_block}) {
    if (s == scheme_name(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

const std::vector<ModelPreset>& model_presets() {
  // Real dimensions from SPEC 7; the scaled-down defaults keep E and k (routing behaviour) and
  // divide H and I by about 8, rounded up to a multiple of 128 so block-scaled kernels accept them.
  static const std::vector<ModelPreset> kPresets = {
      {"mixtral", 8, 2, 4096, 14336, 512, 1792, Routing::softmax_topk, 1, 1, true, 1.0f, false, Scheme::bf16},
      {"deepseek-v3", 256, 8, 7168, 2048, 896, 256, Routing::grouped_topk, 8, 4, true, 2.5f, false,
       Scheme::fp8_block},
      {"llama4", 128, 1, 5120, 8192, 640, 1024, Routing::sigmoid_topk, 1, 1, false, 1.0f, true, Scheme::bf16},
      {"qwen3-moe", 128, 8, 2048, 768, 256, 128, Routing::softmax_topk, 1, 1, true, 1.0f, false, Scheme::bf16},
  };
  return kPresets;
}

const ModelPreset* find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets()) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

Status resolve_shape(const ShapeRequest& req, int64_t tokens, MoeShape* out) {
  MoeShape s;
  if (!req.model.empty()) {
    const ModelPreset* p = find_preset(req.model);
    if (p == nullptr) {
      return InvalidArgument("--model: unknown preset '", req.model, "' (mixtral, deepseek-v3, llama4, qwen3-moe)");
    }
    s.label = std::string(p->name) + (req.full ? "" : "-small");
    s.E = p->E;
    s.k = p->k;
    s.H = req.full ? p->H : p->small_H;
    s.I = req.full ? p->I : p->small_I;
    s.routing = p->routing;
    s.n_group = p->n_group;
    s.topk_group = p->topk_group;
    s.renormalize = p->renormalize;
    s.rsf = p->rsf;
    s.weight_on_input = p->weight_on_input;
    s.scheme = p->scheme;
  } else {
    s.label = "custom";
  }
  if (req.experts >= 0) s.E = req.experts;
  if (req.topk >= 0) s.k = req.topk;
  if (req.hidden >= 0) s.H = req.hidden;
  if (req.inter >= 0) s.I = req.inter;
  if (req.scheme_given) s.scheme = req.scheme;
  if (req.weight_on_input) s.weight_on_input = true;
  s.activation = req.activation;
  s.T = tokens;
  if (s.E < 1) return InvalidArgument("--experts must be >= 1, got ", s.E);
  if (s.k < 1 || s.k > s.E) return InvalidArgument("--topk must be in [1, experts=", s.E, "], got ", s.k);
  if (s.H < 1) return InvalidArgument("--hidden must be >= 1, got ", s.H);
  if (s.I < 1) return InvalidArgument("--inter must be >= 1, got ", s.I);
  if (s.T < 0) return InvalidArgument("--tokens must be >= 0, got ", s.T);
  if (s.weight_on_input && s.k != 1) {
    return InvalidArgument("--weight-on-input needs topk 1, got ", s.k);
  }
  if (s.routing == Routing::grouped_topk && (s.E % s.n_group != 0 || s.k > s.topk_group * (s.E / s.n_group))) {
    s.routing = Routing::softmax_topk;  // custom E/k broke the preset's grouping: plain top-k
  }
  *out = s;
  return Status::Ok();
}

// ---------------------------------------------------------------- hook table
const std::vector<OpHarness>& op_harnesses() {
  static const std::vector<OpHarness> kHooks = {
      {OpKind::topk_softmax, check_topk_softmax, bench_topk_softmax},
      {OpKind::grouped_topk, check_grouped_topk, bench_grouped_topk},
      {OpKind::sigmoid_topk, check_sigmoid_topk, bench_sigmoid_topk},
      {OpKind::sort_tokens, check_sort_tokens, bench_sort_tokens},
      {OpKind::shuffle_weight, check_shuffle_weight, bench_shuffle_weight},
      {OpKind::unshuffle_weight, check_unshuffle_weight, bench_unshuffle_weight},
      {OpKind::quantize_fp8, check_quantize_fp8, bench_quantize_fp8},
      {OpKind::convert_fp8, check_convert_fp8, bench_convert_fp8},
      {OpKind::fused_moe, check_fused_moe, bench_fused_moe, bench_applies_fused_moe},
      {OpKind::pack_weight, check_pack_weight, bench_pack_weight},
      {OpKind::unpack_weight, check_unpack_weight, bench_unpack_weight},
  };
  return kHooks;
}

const OpHarness* find_harness(OpKind op) {
  for (const OpHarness& h : op_harnesses()) {
    if (h.op == op) return &h;
  }
  return nullptr;
}

std::vector<const Kernel*> kernels_to_check(OpKind op, const CheckRequest& req) {
  std::vector<const Kernel*> out;
  for (const Kernel& k : registry().kernels()) {
    if (k.op != op) continue;
    if (req.has_backend && k.backend != req.backend) continue;
    out.push_back(&k);
  }
  return out;
}

}  // namespace moekit::testing
