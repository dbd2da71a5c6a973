// Float64 oracles of the routing ops (SPEC 1) and the shared logit generator
// (src/testing/oracle_routing.h). Deliberately unlike src/ops/*/..._ref.cpp: double math, sorting
// instead of selection, explicit group masks. Covered by tests/test_{topk_softmax,grouped_topk,
// sigmoid_topk}.cpp.
#include "testing/oracle_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace moekit::testing {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row t of a (possibly row-strided) gating view as doubles; NaN becomes -inf (SPEC 1.1).
std::vector<double> logits_row(const TensorView& g, int64_t t) {
  std::vector<double> x(static_cast<size_t>(g.shape[1]));
  for (int64_t e = 0; e < g.shape[1]; ++e) {
    const double v = load_as_f32(g.data, g.dtype, t * g.stride[0] + e);
    x[size_t(e)] = std::isnan(v) ? -kInf : v;
  }
  return x;
}

// Softmax in float64. +inf logits split the mass; no logit above -inf: all zero.
std::vector<double> softmax64(const std::vector<double>& x) {
  std::vector<double> p(x.size(), 0.0);
  const size_t n_pos_inf = size_t(std::count(x.begin(), x.end(), kInf));
  if (n_pos_inf > 0) {
    for (size_t e = 0; e < x.size(); ++e) p[e] = x[e] == kInf ? 1.0 / double(n_pos_inf) : 0.0;
    return p;
  }
  const double mx = *std::max_element(x.begin(), x.end());
  if (mx == -kInf) return p;
  double sum = 0.0;
  for (size_t e = 0; e < x.size(); ++e) sum += std::exp(x[e] - mx);
  for (size_t e = 0; e < x.size(); ++e) p[e] = std::exp(x[e] - mx) / sum;
  return p;
}

double sigmoid64(double x) { return 1.0 / (1.0 + std::exp(-x)); }  // exp(+inf) = inf -> 0

// (score, id) pairs of the given ids in descending score order; NaN ranks like -inf, equal scores
// keep their input order (the caller passes ids ascending).
std::vector<std::pair<double, int64_t>> sorted_desc(const std::vector<double>& score,
                                                    const std::vector<int64_t>& ids) {
  std::vector<std::pair<double, int64_t>> v;
  v.reserve(ids.size());
  for (int64_t id : ids) {
    const double sc = score[size_t(id)];
    v.emplace_back(std::isnan(sc) ? -kInf : sc, id);
  }
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return v;
}

std::vector<int64_t> iota_ids(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// Smallest gap |a - b| / max(|a|, |b|, floor) between two different finite values of v (+inf when
// none). floor 0: a relative gap (softmax probabilities, whose f32 error is relative); floor 1:
// an absolute gap for O(1) scores whose f32 error is absolute (sigmoid, biased scores).
double min_rel_gap(std::vector<double> v, double floor) {
  std::sort(v.begin(), v.end());
  double gap = kInf;
  for (size_t i = 1; i < v.size(); ++i) {
    const double a = v[i - 1], b = v[i];
    if (a == b || !std::isfinite(a) || !std::isfinite(b)) continue;
    gap = std::min(gap, (b - a) / std::max({std::fabs(a), std::fabs(b), floor}));
  }
  return gap;
}

// Appends the k picks (pairs[0..k)) with weights w = score_of(id), optionally renormalized, scaled.
template <class WeightOf>
void emit_row(RoutingExpect& out, const std::vector<std::pair<double, int64_t>>& picks, int64_t k,
              bool renormalize, double scale, WeightOf weight_of) {
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += weight_of(picks[size_t(j)].second);
  for (int64_t j = 0; j < k; ++j) {
    double w = weight_of(picks[size_t(j)].second);
    if (renormalize && sum > 0.0) w /= sum;
    out.ids.push_back(picks[size_t(j)].second);
    out.weights.push_back(w * scale);
  }
}

}  // namespace

RoutingExpect oracle_topk_softmax(const TopkSoftmaxParams& p) {
  RoutingExpect out;
  out.T = p.gating.shape[0];
  out.k = p.k;
  const int64_t E = p.gating.shape[1];
  for (int64_t t = 0; t < out.T; ++t) {
    const std::vector<double> prob = softmax64(logits_row(p.gating, t));
    const auto picks = sorted_desc(prob, iota_ids(E));
    emit_row(out, picks, p.k, p.renormalize, 1.0, [&](int64_t id) { return prob[size_t(id)]; });
    out.min_rel_gap.push_back(min_rel_gap(prob, 0.0));
  }
  if (p.token_expert_indices.present()) {
    for (int64_t t = 0; t < out.T; ++t) {
      for (int64_t j = 0; j < p.k; ++j) out.token_expert_indices.push_back(j * out.T + t);
    }
  }
  return out;
}

RoutingExpect oracle_grouped_topk(const GroupedTopkParams& p) {
  RoutingExpect out;
  out.T = p.gating.shape[0];
  out.k = p.k;
  const int64_t E = p.gating.shape[1], G = p.n_group, group_size = E / G;
  const bool has_bias = p.correction_bias.present();
  for (int64_t t = 0; t < out.T; ++t) {
    const std::vector<double> x = logits_row(p.gating, t);
    std::vector<double> s(x.size());
    if (p.scoring == Scoring::softmax) {
      s = softmax64(x);
    } else {
      std::transform(x.begin(), x.end(), s.begin(), sigmoid64);
    }
    std::vector<double> b(s);
    if (has_bias) {
      for (int64_t e = 0; e < E; ++e) b[size_t(e)] += double(p.correction_bias.ptr<float>()[e]);
    }
    // Group scores from each group's own sorted members.
    std::vector<double> group_score(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<int64_t> members;
      for (int64_t i = 0; i < group_size; ++i) members.push_back(g * group_size + i);
      const auto ranked = sorted_desc(b, members);
      group_score[size_t(g)] = (has_bias && group_size >= 2) ? ranked[0].first + ranked[1].first : ranked[0].first;
    }
    // Explicit keep mask over groups, then candidates = members of kept groups only.
    const auto group_rank = sorted_desc(group_score, iota_ids(G));
    std::vector<bool> keep(static_cast<size_t>(G), false);
    for (int64_t j = 0; j < p.topk_group; ++j) keep[size_t(group_rank[size_t(j)].second)] = true;
    std::vector<int64_t> candidates;
    for (int64_t e = 0; e < E; ++e) {
      if (keep[size_t(e / group_size)]) candidates.push_back(e);
    }
    const auto picks = sorted_desc(b, candidates);
    emit_row(out, picks, p.k, p.renormalize, double(p.routed_scaling_factor),
             [&](int64_t id) { return s[size_t(id)]; });
    std::vector<double> order_values(b);
    if (has_bias) order_values.insert(order_values.end(), group_score.begin(), group_score.end());
    const bool absolute = has_bias || p.scoring == Scoring::sigmoid;
    out.min_rel_gap.push_back(min_rel_gap(order_values, absolute ? 1.0 : 0.0));
  }
  return out;
}

RoutingExpect oracle_sigmoid_topk(const SigmoidTopkParams& p) {
  RoutingExpect out;
  out.T = p.gating.shape[0];
  out.k = p.k;
  const int64_t E = p.gating.shape[1];
  for (int64_t t = 0; t < out.T; ++t) {
    const std::vector<double> x = logits_row(p.gating, t);
    const auto picks = sorted_desc(x, iota_ids(E));
    emit_row(out, picks, p.k, false, 1.0, [&](int64_t id) { return sigmoid64(x[size_t(id)]); });
    out.min_rel_gap.push_back(kInf);  // raw logits compare exactly in every implementation
  }
  return out;
}

Buffer random_logits(Rng& rng, int64_t T, int64_t E, DType dtype, float stddev, float grid, int64_t row_stride,
                     const RowCertifier& certify) {
  const int64_t ld = row_stride > 0 ? row_stride : E;
  Buffer buf(dtype, {T, ld});
  // NOTE: the padding past E holds a large logit, so a kernel reading beyond a row picks it.
  for (int64_t i = 0; i < buf.numel(); ++i) buf.set(i, 100.0f);
  buf.view.shape[1] = E;
  buf.view.stride[0] = ld;
  auto draw_row = [&](int64_t t) {
    for (int64_t e = 0; e < E; ++e) {
      const float v = std::round(rng.normal(0.0f, stddev) / grid) * grid;
      buf.set(t * ld + e, v);
    }
  };
  for (int64_t t = 0; t < T; ++t) draw_row(t);
  if (!certify) return buf;
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::vector<double> gaps = certify(buf.view);
    bool redrawn = false;
    for (int64_t t = 0; t < T; ++t) {
      if (gaps[size_t(t)] < kNearTieGap) {
        draw_row(t);
        redrawn = true;
      }
    }
    if (!redrawn) break;
  }
  return buf;
}

Buffer random_bias(Rng& rng, int64_t E) {
  Buffer bias(DType::f32, {E});
  for (int64_t e = 0; e < E; ++e) bias.set(e, std::round(rng.uniform(-0.5f, 0.5f) * 1024.0f) / 1024.0f);
  return bias;
}

Buffer logits_from_rows(const std::vector<std::vector<float>>& rows, DType dtype) {
  const int64_t T = int64_t(rows.size()), E = rows.empty() ? 1 : int64_t(rows[0].size());
  Buffer b(dtype, {T, E});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) b.set(t * E + e, rows[size_t(t)][size_t(e)]);
  }
  return b;
}

}  // namespace moekit::testing
