// Expert parallelism: the single-process multi-rank simulation on host tensors (include/moekit/ep.h,
// simulate_host). Same plan, dispatch order, expert maps and combine order as the NCCL runner
// (src/ep/ep_nccl.cu); the data moves by host copies and the experts run through the fused_moe front
// door (the registry's host kernel). Tests: tests/test_ep.cpp (suite Ep).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "moekit/ep.h"

namespace moekit::ep {
namespace {

// fp8_dispatch: row -> e4m3fn codes + scale -> decoded row (include/moekit/ep.h, kFp8DispatchMax).
void fp8_roundtrip_row(const void* src, void* dst, DType dt, int64_t H) {
  float amax = 0.0f;
  for (int64_t c = 0; c < H; ++c) amax = std::max(amax, std::fabs(load_as_f32(src, dt, c)));
  const float scale = amax > 0.0f ? amax / kFp8DispatchMax : 1.0f;
  for (int64_t c = 0; c < H; ++c) {
    const uint8_t code = f32_to_e4m3fn_bits(load_as_f32(src, dt, c) / scale);
    store_from_f32(dst, dt, c, e4m3fn_bits_to_f32(code) * scale);
  }
}

}  // namespace

namespace {
Status simulate_host_impl(const std::vector<RankInputs>& ranks, int Eg, const Options& opts) {
  const int world = int(ranks.size());
  const int64_t H = ranks[0].x.shape[1], k = ranks[0].topk_ids.shape[1];
  const DType dt = ranks[0].x.dtype;
  const size_t row_bytes = size_t(H) * dtype_size(dt);
  std::vector<const int32_t*> ids;
  std::vector<int64_t> tokens;
  for (const RankInputs& r : ranks) {
    ids.push_back(r.topk_ids.ptr<const int32_t>());
    tokens.push_back(r.x.shape[0]);
  }
  Plan plan;
  MOEKIT_RETURN_IF_ERROR(make_plan(world, Eg, int(k), ids, tokens, &plan));

  // Dispatch + experts, per destination rank d.
  std::vector<std::vector<unsigned char>> partial(static_cast<size_t>(world));
  for (int d = 0; d < world; ++d) {
    const int64_t R = plan.recvs(d);
    std::vector<unsigned char> rx(size_t(R) * row_bytes);
    std::vector<int32_t> rids(size_t(R * k));
    std::vector<float> rw(size_t(R * k));
    int64_t at = 0;
    for (int s = 0; s < world; ++s) {
      const int64_t off = plan.send_offset(s, d), n = plan.count[size_t(s) * world + d];
      for (int64_t i = 0; i < n; ++i, ++at) {
        const int64_t t = plan.send_token[s][size_t(off + i)];
        const unsigned char* src = ranks[s].x.ptr<const unsigned char>() + size_t(t) * row_bytes;
        if (opts.fp8_dispatch) {
          fp8_roundtrip_row(src, rx.data() + size_t(at) * row_bytes, dt, H);
        } else {
          std::memcpy(rx.data() + size_t(at) * row_bytes, src, row_bytes);
        }
        std::memcpy(rids.data() + at * k, ranks[s].topk_ids.ptr<const int32_t>() + t * k, size_t(k) * 4);
        std::memcpy(rw.data() + at * k, ranks[s].topk_weights.ptr<const float>() + t * k, size_t(k) * 4);
      }
    }
    partial[d].assign(size_t(R) * row_bytes, 0);
    if (R == 0) continue;
    std::vector<int32_t> map(static_cast<size_t>(Eg), -1);
    for (int e = 0; e < plan.experts_per_rank; ++e) map[size_t(d * plan.experts_per_rank + e)] = e;
    FusedMoeParams p;
    p.x = TensorView::contiguous(rx.data(), dt, {R, H});
    p.w1 = ranks[d].w1;
    p.w2 = ranks[d].w2;
    p.topk_ids = TensorView::contiguous(rids.data(), DType::i32, {R, k});
    p.topk_weights = TensorView::contiguous(rw.data(), DType::f32, {R, k});
    p.out = TensorView::contiguous(partial[d].data(), dt, {R, H});
    p.expert_map = TensorView::contiguous(map.data(), DType::i32, {int64_t(Eg)});
    p.w1_scale = ranks[d].w1_scale;
    p.w2_scale = ranks[d].w2_scale;
    p.scale_block_n = opts.scale_block_n;
    p.scale_block_k = opts.scale_block_k;
    p.activation = opts.activation;
    p.round_intermediate = opts.round_intermediate;
    p.weight_on_input = opts.weight_on_input;
    MOEKIT_RETURN_IF_ERROR(fused_moe(p));
  }

  // Combine, per source rank s: out[t] = round(sum over d ascending of the partial row of (t, d)).
  std::vector<float> acc(static_cast<size_t>(H));
  for (int s = 0; s < world; ++s) {
    for (int64_t t = 0; t < plan.tokens[s]; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int d = 0; d < world; ++d) {
        const int32_t row = plan.combine_row[s][size_t(t) * world + d];
        if (row < 0) continue;
        const int64_t at = plan.recv_offset(d, s) + (row - plan.send_offset(s, d));
        for (int64_t c = 0; c < H; ++c) acc[size_t(c)] += load_as_f32(partial[d].data(), dt, at * H + c);
      }
      for (int64_t c = 0; c < H; ++c) store_from_f32(ranks[s].out.data, dt, t * H + c, acc[size_t(c)]);
    }
  }
  return Status::Ok();
}
}  // namespace

Status simulate_host(const std::vector<RankInputs>& ranks, int Eg, const Options& opts) {
  MOEKIT_RETURN_IF_ERROR(validate(ranks, Eg, /*on_device=*/false));
  // The simulation's buffers are host vectors: a failed allocation is a Status, not a throw.
  return status_of([&] { return simulate_host_impl(ranks, Eg, opts); },
                   [&] { return "ep::simulate_host (" + std::to_string(ranks.size()) + " ranks, Eg = " +
                                std::to_string(Eg) + ")"; });
}

}  // namespace moekit::ep
