// grouped_topk reference kernel (SPEC 1.2): scalar, f32, single-threaded. Test:
// tests/test_grouped_topk.cpp (against the float64 oracle of src/testing/oracle_routing.cpp).
//
// Per token: s = softmax(row) or sigmoid(x) in f32 (NaN logit = -inf, so s = 0); b = s + bias
// (NaN b -> -inf); group score = top-2 sum of b (bias given) or max b (no bias); the topk_group
// best groups stay eligible; ids = top-k of b among eligible experts, ties to the lower id;
// weights = s[ids], renormalized when asked (unless the sum is 0), times routed_scaling_factor.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "moekit/ops/routing.h"
#include "ref/ref_kernels.h"
#include "ref/ref_topk.h"

namespace moekit::ref {

namespace {

Status supports(const GroupedTopkParams& p) {
  return require_host({{"gating", &p.gating}, {"correction_bias", &p.correction_bias},
                       {"topk_weights", &p.topk_weights}, {"topk_ids", &p.topk_ids}});
}

Status run(const GroupedTopkParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1], k = p.k;
  const int64_t n_group = p.n_group, group_size = Eg / n_group;
  const float* bias = p.correction_bias.present() ? p.correction_bias.ptr<float>() : nullptr;
  std::vector<float> s(static_cast<size_t>(Eg)), b(static_cast<size_t>(Eg));
  std::vector<float> group_score(static_cast<size_t>(n_group));
  std::vector<int> kept_groups(static_cast<size_t>(p.topk_group)), ids(static_cast<size_t>(k));
  // NOTE: std::vector<bool> has no data(); a plain array of bool feeds topk_desc's mask.
  std::unique_ptr<bool[]> eligible(new bool[static_cast<size_t>(Eg)]);
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();

  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = t * p.gating.stride[0];
    if (p.scoring == Scoring::softmax) {
      softmax_row(p.gating.data, p.gating.dtype, row, Eg, s.data());
    } else {
      for (int64_t e = 0; e < Eg; ++e) s[size_t(e)] = sigmoid_f32(load_as_f32(p.gating.data, p.gating.dtype, row + e));
    }
    for (int64_t e = 0; e < Eg; ++e) {
      const float v = bias ? s[size_t(e)] + bias[e] : s[size_t(e)];
      b[size_t(e)] = std::isnan(v) ? kNegInf : v;
    }

    for (int64_t g = 0; g < n_group; ++g) {
      const float* bg = b.data() + g * group_size;
      if (bias) {
        int top2[2] = {0, 0};
        const int n_top = group_size >= 2 ? 2 : 1;
        topk_desc(bg, group_size, n_top, top2);
        group_score[size_t(g)] = n_top == 2 ? bg[top2[0]] + bg[top2[1]] : bg[top2[0]];
      } else {
        float mx = kNegInf;
        for (int64_t i = 0; i < group_size; ++i) mx = std::max(mx, bg[i]);
        group_score[size_t(g)] = mx;
      }
    }
    topk_desc(group_score.data(), n_group, p.topk_group, kept_groups.data());
    for (int64_t e = 0; e < Eg; ++e) eligible[size_t(e)] = false;
    for (int g : kept_groups) {
      for (int64_t i = 0; i < group_size; ++i) eligible[size_t(g * group_size + i)] = true;
    }
    // Experts of dropped groups are -inf AND ineligible: they rank below every kept expert, even
    // one whose own b is -inf (only a -inf or NaN bias gives a kept expert that b).
    for (int64_t e = 0; e < Eg; ++e) {
      if (!eligible[size_t(e)]) b[size_t(e)] = kNegInf;
    }
    topk_desc(b.data(), Eg, int(k), ids.data(), eligible.get());

    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += s[size_t(ids[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      float w = s[size_t(ids[size_t(j)])];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w * p.routed_scaling_factor;
      id_out[t * k + j] = ids[size_t(j)];
    }
  }
  return Status::Ok();
}

}  // namespace

void register_grouped_topk(Registry& r) {
  r.add({"grouped_topk_ref", OpKind::grouped_topk, MoeVariant::none, Backend::ref,
         "gating f32|bf16|f16, bias f32 -> f32 weights, i32 ids; f32 math", 0,
         erase_supports<GroupedTopkParams, supports>, nullptr, erase_run<GroupedTopkParams, run>});
}

}  // namespace moekit::ref
