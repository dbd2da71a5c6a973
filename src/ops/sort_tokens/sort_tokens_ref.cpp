// sort_tokens reference kernel (SPEC 2, contract moekit/ops/sorting.h): scalar, single-threaded.
// Test: tests/test_sort_tokens.cpp (checked against src/testing/oracle_sort_tokens.cpp, which sorts
// (expert, token, slot) triples instead).
//
// Counting sort in three passes:
//   1. count the entries of each local expert (and reject a bad id before anything is written),
//   2. exclusive prefix sum of the padded counts -> start offset of each expert's run,
//   3. fill every output with its padding value, then scatter the entries in (token, slot) order,
//      which is exactly the order required inside an expert.
#include <cstdint>
#include <vector>

#include "moekit/ops/sorting.h"
#include "ops/sort_tokens/sort_tokens_local.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

Status supports(const SortTokensParams& p) {
  return require_host({{"topk_ids", &p.topk_ids},
                       {"topk_weights", &p.topk_weights},
                       {"expert_mask", &p.expert_mask},
                       {"expert_map", &p.expert_map},
                       {"sorted_token_ids", &p.sorted_token_ids},
                       {"sorted_weights", &p.sorted_weights},
                       {"sorted_expert_ids", &p.sorted_expert_ids},
                       {"num_valid", &p.num_valid},
                       {"error_count", &p.error_count}});
}

Status run(const SortTokensParams& p, const RunContext&) {
  const int64_t T = p.topk_ids.shape[0], k = p.topk_ids.shape[1];
  const int64_t E = p.num_experts, bm = p.block_m;
  const int64_t max_padded = p.sorted_token_ids.shape[0];
  const int64_t max_blocks = p.sorted_expert_ids.shape[0];
  const int32_t* ids = p.topk_ids.ptr<int32_t>();
  const float* weights = p.topk_weights.ptr<float>();
  const std::vector<int32_t> local = sort_tokens_local_table(p);
  const int64_t Eg = int64_t(local.size());

  // Pass 1: counts per local expert. An id outside [-1, Eg) is rejected here, before any write.
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t g = ids[i];
    if (g == -1) continue;
    if (g < 0 || g >= Eg) {
      return InvalidArgument("topk_ids: token ", i / k, " slot ", i % k, " has expert id ", g,
                             ", outside [0, Eg=", Eg, ") (-1 means no expert)");
    }
    const int32_t e = local[size_t(g)];
    // NOTE: validate_sort_tokens() guarantees e < E; re-checked so a direct Kernel::run call on an
    // unvalidated map cannot index out of bounds.
    if (e >= E) return Internal("sort_tokens_ref: expert_map sends expert ", g, " to ", e, " >= E=", E);
    if (e >= 0) ++count[size_t(e)];
  }

  // Pass 2: each expert's run starts where the previous (padded) run ends.
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t padded = (count[size_t(e)] + bm - 1) / bm * bm;
    start[size_t(e) + 1] = start[size_t(e)] + padded;
  }
  const int64_t num_valid = start[size_t(E)];
  if (num_valid > max_padded) {
    return Internal("sort_tokens_ref: padded length ", num_valid, " exceeds max_padded ", max_padded);
  }

  // Pass 3: padding everywhere, block owners, then the entries.
  const int32_t pad = p.encoding == SortEncoding::packed ? int32_t((k << 24) | T) : int32_t(T * k);
  int32_t* out_ids = p.sorted_token_ids.ptr<int32_t>();
  float* out_w = p.sorted_weights.ptr<float>();
  int32_t* out_e = p.sorted_expert_ids.ptr<int32_t>();
  for (int64_t i = 0; i < max_padded; ++i) {
    out_ids[i] = pad;
    out_w[i] = 0.0f;
  }
  for (int64_t b = 0; b < max_blocks; ++b) out_e[b] = -1;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t b = start[size_t(e)] / bm; b < start[size_t(e) + 1] / bm; ++b) out_e[b] = int32_t(e);
  }
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t g = ids[t * k + j];
      if (g == -1 || local[size_t(g)] < 0) continue;
      const int64_t pos = cursor[size_t(local[size_t(g)])]++;
      out_ids[pos] = p.encoding == SortEncoding::packed ? int32_t((j << 24) | t) : int32_t(t * k + j);
      out_w[pos] = weights[t * k + j];
    }
  }
  p.num_valid.ptr<int32_t>()[0] = int32_t(num_valid);
  if (p.error_count.present()) p.error_count.ptr<int32_t>()[0] = 0;  // bad ids were rejected in pass 1
  return Status::Ok();
}

}  // namespace

void register_sort_tokens(Registry& r) {
  r.add({"sort_tokens_ref", OpKind::sort_tokens, MoeVariant::none, Backend::ref,
         "topk_ids i32, topk_weights f32 -> i32 ids (packed|flat), f32 weights copied", 0,
         erase_supports<SortTokensParams, supports>, nullptr, erase_run<SortTokensParams, run>});
}

}  // namespace moekit::ref
