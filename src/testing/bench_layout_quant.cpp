// `moekit bench` hooks of the layout and quantization ops (harness.h): quantize_fp8 (x [T, H] of
// the preset, 1 x 128 token groups, DeepSeek-V3's activation scheme), convert_fp8 (e4m3fn [T, H]
// codes + one scale per row -> e4m3fnuz), and shuffle / unshuffle / pack / unpack of one expert's
// w1 [N1, H] (bf16; the token count does not change these problems). The problems run through the
// op's front door with RunOptions.kernel = the kernel, and count the bytes read and written as the
// memory floor (no flops). Host kernels time run(); device kernels (quantize_fp8 and convert_fp8
// only) get kDeviceSets copies of the buffers on the device (DeviceMirror) and launch(stream, set)
// runs the op on one copy (CUDA-graph timed by `moekit bench`).
// Used by: tools/moekit (cmd_bench.cpp); the hooks' problems are the check hooks' shapes at full
// size when --full is given.
#include <memory>
#include <string>
#include <vector>

#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"
#include "testing/harness.h"

namespace moekit::testing {

namespace {

// The op call of a problem on views of its buffers (host or one device set).
using OpCall = Status (*)(const std::vector<TensorView>& v, const RunOptions& o);

std::vector<TensorView> views_of(const std::vector<Buffer>& buf) {
  std::vector<TensorView> v;
  for (const Buffer& b : buf) v.push_back(b.view);
  return v;
}

// A host problem over owned buffers: run() calls the op on them.
class HostBench : public BenchProblem {
 public:
  std::vector<Buffer> buf;
  std::string kernel;
  OpCall call = nullptr;
  Status run() override {
    RunOptions o;
    o.kernel = kernel.c_str();
    return call(views_of(buf), o);
  }
};

// A device problem: kDeviceSets copies of a host problem's buffers on the kernel's device;
// launch(stream, s) enqueues the op on copy s without synchronising.
constexpr int kDeviceSets = 4;
class DeviceBench : public BenchProblem {
 public:
  explicit DeviceBench(Backend b) : mirror(b) {}
  DeviceMirror mirror;                        // owns the device copies
  std::vector<std::vector<TensorView>> sets_;  // [set][buffer]
  std::string kernel;
  OpCall call = nullptr;
  Status launch(void* stream, int set) override {
    if (set < 0 || set >= int(sets_.size())) return InvalidArgument("set: must be in [0, ", sets_.size(), "), got ", set);
    RunOptions o;
    o.kernel = kernel.c_str();
    o.stream = stream;
    return call(sets_[size_t(set)], o);
  }
  Status run() override {
    MOEKIT_RETURN_IF_ERROR(launch(nullptr, 0));
    return registry().device_ops(Backend::cuda)->synchronize();
  }
};

Status require_host_kernel(const Kernel& k) {
  if (registry().device_ops(k.backend) != nullptr) {
    return Unsupported(k.name, ": this benchmark has host problems only");
  }
  return registry().backend_available(k.backend);
}

// Hands the host problem h out as is (host kernel) or as kDeviceSets device copies of its buffers.
Status finish(const Kernel& k, std::unique_ptr<HostBench> h, std::unique_ptr<BenchProblem>* out) {
  if (registry().device_ops(k.backend) == nullptr) {
    *out = std::move(h);
    return Status::Ok();
  }
  auto d = std::make_unique<DeviceBench>(k.backend);
  for (int s = 0; s < kDeviceSets; ++s) {
    std::vector<TensorView> v = views_of(h->buf);
    for (TensorView& t : v) MOEKIT_RETURN_IF_ERROR(d->mirror.input(&t));
    d->sets_.push_back(v);
  }
  d->kernel = h->kernel;
  d->call = h->call;
  d->shape = h->shape;
  d->flops = h->flops;
  d->bytes = h->bytes;
  d->sets = kDeviceSets;
  *out = std::move(d);
  return Status::Ok();
}

// Shape of the preset (full or scaled) at `tokens` tokens.
Status shape_of(const BenchRequest& req, int64_t tokens, MoeShape* s) { return resolve_shape(req.shape, tokens, s); }

}  // namespace

Status bench_quantize_fp8(const BenchRequest& req, int64_t tokens, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  MOEKIT_RETURN_IF_ERROR(registry().backend_available(k.backend));
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(shape_of(req, tokens, &s));
  constexpr int64_t kGroup = 128;
  auto b = std::make_unique<HostBench>();
  b->kernel = k.name;
  b->buf.emplace_back(DType::bf16, std::vector<int64_t>{s.T, s.H});
  b->buf.emplace_back(DType::fp8_e4m3fn, std::vector<int64_t>{s.T, s.H});
  b->buf.emplace_back(DType::f32, std::vector<int64_t>{s.T, (s.H + kGroup - 1) / kGroup});
  Rng rng(req.shape.seed);
  rng.fill_normal(b->buf[0], 1.0f);
  b->call = [](const std::vector<TensorView>& v, const RunOptions& o) {
    QuantizeFp8Params p{v[0], v[1], v[2]};
    p.granularity = QuantGranularity::per_token_group;
    p.group_k = int(kGroup);
    return quantize_fp8(p, o);
  };
  b->shape = s.label + " x [" + std::to_string(s.T) + ", " + std::to_string(s.H) + "] bf16 -> e4m3fn, 1x128 groups";
  b->bytes = double(s.T * s.H) * 3.0 + double(b->buf[2].numel()) * 4.0;
  return finish(k, std::move(b), out);
}

Status bench_convert_fp8(const BenchRequest& req, int64_t tokens, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  MOEKIT_RETURN_IF_ERROR(registry().backend_available(k.backend));
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(shape_of(req, tokens, &s));
  auto b = std::make_unique<HostBench>();
  b->kernel = k.name;
  b->buf.emplace_back(DType::fp8_e4m3fn, std::vector<int64_t>{s.T, s.H});
  b->buf.emplace_back(DType::fp8_e4m3fnuz, std::vector<int64_t>{s.T, s.H});
  b->buf.emplace_back(DType::f32, std::vector<int64_t>{s.T});
  b->buf.emplace_back(DType::f32, std::vector<int64_t>{s.T});
  Rng rng(req.shape.seed);
  for (unsigned char& c : b->buf[0].bytes) c = static_cast<unsigned char>(rng.gen() & 0xFFu);
  rng.fill_uniform(b->buf[2], 0.5f, 2.0f);
  b->call = [](const std::vector<TensorView>& v, const RunOptions& o) {
    ConvertFp8Params p{v[0], v[1], v[2], v[3]};
    return convert_fp8(p, o);
  };
  b->shape = s.label + " [" + std::to_string(s.T) + ", " + std::to_string(s.H) + "] e4m3fn -> e4m3fnuz + row scales";
  b->bytes = double(s.T * s.H) * 2.0 + double(s.T) * 8.0;
  return finish(k, std::move(b), out);
}

namespace {

// One expert's w1 [N1, H] in bf16, moved by a layout op (shuffle / pack and their inverses).
Status layout_bench(const BenchRequest& req, const Kernel& k, bool pack, bool inverse,
                    std::unique_ptr<BenchProblem>* out) {
  MOEKIT_RETURN_IF_ERROR(require_host_kernel(k));
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(shape_of(req, 1, &s));
  const int64_t N1 = (s.g1u1 ? 2 : 1) * s.I;
  auto b = std::make_unique<HostBench>();
  b->kernel = k.name;
  b->buf.emplace_back(DType::bf16, std::vector<int64_t>{N1, s.H});
  b->buf.emplace_back(DType::bf16, std::vector<int64_t>{N1, s.H});
  Rng rng(req.shape.seed);
  rng.fill_normal(b->buf[0], 1.0f);
  const Layout other = pack ? Layout::cpu_vnni2_n32 : Layout::shuffled_16x16;
  (inverse ? b->buf[0] : b->buf[1]).view.layout = other;
  using V = const std::vector<TensorView>&;
  if (pack) {
    b->call = inverse ? OpCall([](V v, const RunOptions& o) { return unpack_weight({v[0], v[1]}, o); })
                      : OpCall([](V v, const RunOptions& o) { return pack_weight({v[0], v[1]}, o); });
  } else {
    b->call = inverse ? OpCall([](V v, const RunOptions& o) { return unshuffle_weight({v[0], v[1]}, o); })
                      : OpCall([](V v, const RunOptions& o) { return shuffle_weight({v[0], v[1]}, o); });
  }
  b->shape = s.label + " one expert's w1 [" + std::to_string(N1) + ", " + std::to_string(s.H) + "] bf16 " +
             (inverse ? std::string(layout_name(other)) + " -> row_major" : "row_major -> " + std::string(layout_name(other)));
  b->bytes = double(N1 * s.H) * 4.0;
  *out = std::move(b);
  return Status::Ok();
}

}  // namespace

Status bench_shuffle_weight(const BenchRequest& req, int64_t, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  return layout_bench(req, k, false, false, out);
}
Status bench_unshuffle_weight(const BenchRequest& req, int64_t, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  return layout_bench(req, k, false, true, out);
}
Status bench_pack_weight(const BenchRequest& req, int64_t, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  return layout_bench(req, k, true, false, out);
}
Status bench_unpack_weight(const BenchRequest& req, int64_t, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  return layout_bench(req, k, true, true, out);
}

}  // namespace moekit::testing
