// `moekit bench` hooks of the layout and quantization ops (harness.h): quantize_fp8 (x [T, H] of
// the preset, 1 x 128 token groups, DeepSeek-V3's activation scheme), convert_fp8 (e4m3fn [T, H]
// codes + one scale per row -> e4m3fnuz), and shuffle / unshuffle / pack / unpack of one expert's
// w1 [N1, H] (bf16; the token count does not change these problems). Host kernels only: the
// problems run through the op's front door with RunOptions.kernel = the kernel, and count the
// bytes read and written as the memory floor (no flops).
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

// A host problem over owned buffers: run() calls fn(kernel name).
class HostBench : public BenchProblem {
 public:
  std::vector<Buffer> buf;
  std::string kernel;
  Status (*call)(HostBench& b) = nullptr;
  Status run() override { return call(*this); }
  RunOptions opts() const {
    RunOptions o;
    o.kernel = kernel.c_str();
    return o;
  }
};

Status require_host_kernel(const Kernel& k) {
  if (registry().device_ops(k.backend) != nullptr) {
    return Unsupported(k.name, ": this benchmark has host problems only");
  }
  return registry().backend_available(k.backend);
}

// Shape of the preset (full or scaled) at `tokens` tokens.
Status shape_of(const BenchRequest& req, int64_t tokens, MoeShape* s) { return resolve_shape(req.shape, tokens, s); }

}  // namespace

Status bench_quantize_fp8(const BenchRequest& req, int64_t tokens, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  MOEKIT_RETURN_IF_ERROR(require_host_kernel(k));
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
  b->call = [](HostBench& h) {
    QuantizeFp8Params p{h.buf[0].view, h.buf[1].view, h.buf[2].view};
    p.granularity = QuantGranularity::per_token_group;
    p.group_k = int(kGroup);
    return quantize_fp8(p, h.opts());
  };
  b->shape = s.label + " x [" + std::to_string(s.T) + ", " + std::to_string(s.H) + "] bf16 -> e4m3fn, 1x128 groups";
  b->bytes = double(s.T * s.H) * 3.0 + double(b->buf[2].numel()) * 4.0;
  *out = std::move(b);
  return Status::Ok();
}

Status bench_convert_fp8(const BenchRequest& req, int64_t tokens, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  MOEKIT_RETURN_IF_ERROR(require_host_kernel(k));
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
  b->call = [](HostBench& h) {
    ConvertFp8Params p{h.buf[0].view, h.buf[1].view, h.buf[2].view, h.buf[3].view};
    return convert_fp8(p, h.opts());
  };
  b->shape = s.label + " [" + std::to_string(s.T) + ", " + std::to_string(s.H) + "] e4m3fn -> e4m3fnuz + row scales";
  b->bytes = double(s.T * s.H) * 2.0 + double(s.T) * 8.0;
  *out = std::move(b);
  return Status::Ok();
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
  if (pack) {
    b->call = inverse ? [](HostBench& h) { return unpack_weight({h.buf[0].view, h.buf[1].view}, h.opts()); }
                      : [](HostBench& h) { return pack_weight({h.buf[0].view, h.buf[1].view}, h.opts()); };
  } else {
    b->call = inverse ? [](HostBench& h) { return unshuffle_weight({h.buf[0].view, h.buf[1].view}, h.opts()); }
                      : [](HostBench& h) { return shuffle_weight({h.buf[0].view, h.buf[1].view}, h.opts()); };
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
