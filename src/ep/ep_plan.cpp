// Expert parallelism: the host plan of one step and the cross-rank checks (include/moekit/ep.h).
// Tests: tests/test_ep.cpp (suite Ep: plan vs a brute-force count, validation messages).
#include <string>

#include "core/check.h"
#include "moekit/ep.h"

namespace moekit::ep {

int64_t Plan::sends(int s) const {
  int64_t n = 0;
  for (int d = 0; d < world; ++d) n += count[size_t(s) * world + d];
  return n;
}
int64_t Plan::recvs(int d) const {
  int64_t n = 0;
  for (int s = 0; s < world; ++s) n += count[size_t(s) * world + d];
  return n;
}
int64_t Plan::send_offset(int s, int d) const {
  int64_t n = 0;
  for (int j = 0; j < d; ++j) n += count[size_t(s) * world + j];
  return n;
}
int64_t Plan::recv_offset(int d, int s) const {
  int64_t n = 0;
  for (int j = 0; j < s; ++j) n += count[size_t(j) * world + d];
  return n;
}

Status make_plan(int world, int Eg, int k, const std::vector<const int32_t*>& ids, const std::vector<int64_t>& tokens,
                 Plan* plan) {
  if (world < 1) return InvalidArgument("world: must be >= 1, got ", world);
  if (Eg < world || Eg % world != 0) {
    return InvalidArgument("Eg: global experts must be a positive multiple of world = ", world, ", got ", Eg);
  }
  if (k < 1) return InvalidArgument("k: must be >= 1, got ", k);
  if (int(ids.size()) != world || int(tokens.size()) != world) {
    return InvalidArgument("ids/tokens: need one entry per rank (", world, "), got ", ids.size(), " / ",
                           tokens.size());
  }
  for (int s = 0; s < world; ++s) {
    if (tokens[s] < 0) return InvalidArgument("tokens[", s, "]: must be >= 0, got ", tokens[s]);
    if (tokens[s] > 0 && ids[s] == nullptr) return InvalidArgument("ids[", s, "]: null with ", tokens[s], " tokens");
    for (int64_t i = 0; i < tokens[s] * k; ++i) {
      const int32_t g = ids[s][i];
      if (g < -1 || g >= Eg) {
        return InvalidArgument("topk_ids of rank ", s, ": id at token ", i / k, " slot ", i % k,
                               " must be in [-1, ", Eg, "), got ", g);
      }
    }
  }
  Plan p;
  p.world = world;
  p.Eg = Eg;
  p.k = k;
  p.experts_per_rank = Eg / world;
  p.tokens = tokens;
  p.count.assign(size_t(world) * world, 0);
  p.send_token.resize(world);
  p.combine_row.resize(world);
  std::vector<char> to(static_cast<size_t>(world));
  for (int s = 0; s < world; ++s) {
    const int64_t T = tokens[s];
    std::vector<std::vector<int32_t>> per_dst(static_cast<size_t>(world));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(to.begin(), to.end(), 0);
      for (int j = 0; j < k; ++j) {
        const int32_t g = ids[s][t * k + j];
        if (g >= 0) to[g / p.experts_per_rank] = 1;
      }
      for (int d = 0; d < world; ++d) {
        if (to[d]) per_dst[d].push_back(int32_t(t));
      }
    }
    auto& rows = p.send_token[s];
    auto& comb = p.combine_row[s];
    comb.assign(size_t(T) * world, -1);
    for (int d = 0; d < world; ++d) {
      p.count[size_t(s) * world + d] = int64_t(per_dst[d].size());
      for (int32_t t : per_dst[d]) {
        comb[size_t(t) * world + d] = int32_t(rows.size());
        rows.push_back(t);
      }
    }
  }
  *plan = std::move(p);
  return Status::Ok();
}

Status validate(const std::vector<RankInputs>& ranks, int Eg, bool on_device) {
  const int world = int(ranks.size());
  if (world < 1) return InvalidArgument("ranks: need at least one rank, got 0");
  if (Eg < world || Eg % world != 0) {
    return InvalidArgument("Eg: global experts must be a positive multiple of world = ", world, ", got ", Eg);
  }
  const RankInputs& r0 = ranks[0];
  for (int r = 0; r < world; ++r) {
    const RankInputs& q = ranks[r];
    const std::string at = "rank " + std::to_string(r) + " ";
    const struct {
      const TensorView* t;
      const char* name;
      int ndim;  // 0: optional, any rank
    } all[] = {{&q.x, "x", 2}, {&q.topk_ids, "topk_ids", 2}, {&q.topk_weights, "topk_weights", 2},
               {&q.w1, "w1", 3}, {&q.w2, "w2", 3}, {&q.out, "out", 2}, {&q.w1_scale, "w1_scale", 0},
               {&q.w2_scale, "w2_scale", 0}};
    for (const auto& a : all) {
      if (a.ndim == 0 && !a.t->present()) continue;
      if (a.ndim != 0 && a.t->ndim != a.ndim) {
        return InvalidArgument(at, a.name, ": must have ", a.ndim, " dims, got ", a.t->ndim);
      }
      if (!a.t->is_contiguous()) return InvalidArgument(at, a.name, ": must be contiguous");
      const bool dev = a.t->device == Device::cuda;
      if (dev != on_device) {
        return InvalidArgument(at, a.name, ": must live on ", on_device ? "a CUDA device" : "the host", ", got ",
                               a.t->describe());
      }
      if (on_device && a.t->device_index != q.x.device_index) {
        return InvalidArgument(at, a.name, ": must be on rank ", r, "'s device ", q.x.device_index, ", got device ",
                               a.t->device_index);
      }
    }
    const int64_t T = q.x.shape[0], H = q.x.shape[1], k = q.topk_ids.shape[1];
    if (q.x.dtype != r0.x.dtype || q.out.dtype != r0.x.dtype || q.w1.dtype != r0.w1.dtype ||
        q.w2.dtype != r0.w1.dtype || (q.w1.dtype != q.x.dtype && q.w1.dtype != DType::fp8_e4m3fn)) {
      return InvalidArgument(at, "x/out/w1/w2: must be ", dtype_name(r0.x.dtype), "/", dtype_name(r0.x.dtype), "/",
                             dtype_name(r0.w1.dtype), "/", dtype_name(r0.w1.dtype),
                             " (rank 0's; weights x's dtype or fp8_e4m3fn), got ", dtype_name(q.x.dtype), "/",
                             dtype_name(q.out.dtype), "/", dtype_name(q.w1.dtype), "/", dtype_name(q.w2.dtype));
    }
    if (is_fp8(q.w1.dtype) != q.w1_scale.present() || is_fp8(q.w1.dtype) != q.w2_scale.present()) {
      return InvalidArgument(at, "w1_scale/w2_scale: needed exactly when the weights are fp8, weights ",
                             dtype_name(q.w1.dtype), ", scales ", q.w1_scale.present() ? "given" : "absent");
    }
    if (!is_float16ish(q.x.dtype) && q.x.dtype != DType::f32) {
      return InvalidArgument(at, "x: EP needs bf16, f16 or f32 (unquantized), got ", dtype_name(q.x.dtype));
    }
    if (q.topk_ids.dtype != DType::i32) return InvalidArgument(at, "topk_ids: must be i32, got ", dtype_name(q.topk_ids.dtype));
    if (q.topk_weights.dtype != DType::f32) {
      return InvalidArgument(at, "topk_weights: must be f32, got ", dtype_name(q.topk_weights.dtype));
    }
    if (H != r0.x.shape[1]) return InvalidArgument(at, "x: hidden size must be ", r0.x.shape[1], " (rank 0), got ", H);
    if (k != r0.topk_ids.shape[1]) return InvalidArgument(at, "topk_ids: k must be ", r0.topk_ids.shape[1], " (rank 0), got ", k);
    if (q.topk_ids.shape[0] != T || q.topk_weights.shape[0] != T || q.topk_weights.shape[1] != k) {
      return InvalidArgument(at, "topk_ids/topk_weights: must be [", T, ", ", k, "], got ", q.topk_ids.describe(), " / ",
                             q.topk_weights.describe());
    }
    if (q.out.shape[0] != T || q.out.shape[1] != H) {
      return InvalidArgument(at, "out: must be [", T, ", ", H, "], got ", q.out.describe());
    }
    if (q.w1.shape[0] * world != Eg) {
      return InvalidArgument(at, "w1: must hold Eg / world = ", Eg / world, " experts, got ", q.w1.shape[0]);
    }
    for (int d = 0; d < 3; ++d) {
      if (q.w1.shape[d] != r0.w1.shape[d] || q.w2.shape[d] != r0.w2.shape[d]) {
        return InvalidArgument(at, "w1/w2: must match rank 0's ", r0.w1.describe(), " / ", r0.w2.describe(), ", got ",
                               q.w1.describe(), " / ", q.w2.describe());
      }
    }
    if (on_device) {
      for (int j = 0; j < r; ++j) {
        if (ranks[j].x.device_index == q.x.device_index) {
          return InvalidArgument(at, "x: each rank needs its own device, device ", q.x.device_index, " is rank ", j, "'s");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace moekit::ep
