// sort_tokens oracle, generator, buffers and comparison (src/testing/oracle_sort_tokens.h).
#include "testing/oracle_sort_tokens.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

namespace moekit::testing {

SortTokensOutput oracle_sort_tokens(const SortTokensInput& in) {
  // Global -> local, written from the definitions rather than a running cumsum: with a mask the
  // local index is the rank of the expert among the kept ones.
  std::vector<int32_t> kept;  // kept global experts in ascending order (mask form)
  for (size_t g = 0; g < in.expert_mask.size(); ++g) {
    if (in.expert_mask[g] == 1) kept.push_back(int32_t(g));
  }
  auto local_of = [&](int32_t g) -> int64_t {
    if (!in.expert_mask.empty()) {
      const auto it = std::lower_bound(kept.begin(), kept.end(), g);
      return (it != kept.end() && *it == g) ? int64_t(it - kept.begin()) : -1;
    }
    if (!in.expert_map.empty()) return in.expert_map[size_t(g)];
    return g;
  };

  struct Entry {
    int64_t expert, token, slot;
  };
  std::vector<Entry> entries;
  for (int64_t t = 0; t < in.T; ++t) {
    for (int64_t j = 0; j < in.k; ++j) {
      const int32_t g = in.topk_ids[size_t(t * in.k + j)];
      if (g == -1) continue;
      const int64_t e = local_of(g);
      if (e >= 0) entries.push_back({e, t, j});
    }
  }
  // Entries were generated in (token, slot) order; a stable sort by expert keeps that order inside
  // each expert, which is the contract.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.expert < b.expert; });

  const int32_t pad = in.encoding == SortEncoding::packed ? int32_t((in.k << 24) | in.T) : int32_t(in.T * in.k);
  SortTokensOutput out;
  size_t i = 0;
  while (i < entries.size()) {
    const int64_t e = entries[i].expert;
    size_t n = 0;
    for (; i < entries.size() && entries[i].expert == e; ++i, ++n) {
      const Entry& x = entries[i];
      out.sorted_token_ids.push_back(in.encoding == SortEncoding::packed ? int32_t((x.slot << 24) | x.token)
                                                                         : int32_t(x.token * in.k + x.slot));
      out.sorted_weights.push_back(in.topk_weights[size_t(x.token * in.k + x.slot)]);
    }
    for (; n % size_t(in.block_m) != 0; ++n) {
      out.sorted_token_ids.push_back(pad);
      out.sorted_weights.push_back(0.0f);
    }
    for (size_t b = 0; b < n / size_t(in.block_m); ++b) out.sorted_expert_ids.push_back(int32_t(e));
  }
  out.num_valid = int32_t(out.sorted_token_ids.size());
  const int64_t max_padded = sort_tokens_max_padded(in.T, in.k, in.E, in.block_m);
  const int64_t max_blocks = sort_tokens_max_blocks(in.T, in.k, in.E, in.block_m);
  out.sorted_token_ids.resize(size_t(max_padded), pad);
  out.sorted_weights.resize(size_t(max_padded), 0.0f);
  out.sorted_expert_ids.resize(size_t(max_blocks), -1);
  return out;
}

std::vector<int32_t> mask_to_map(const std::vector<int32_t>& mask) {
  std::vector<int32_t> map(mask.size(), -1);
  int32_t next = 0;
  for (size_t g = 0; g < mask.size(); ++g) {
    if (mask[g]) map[g] = next++;
  }
  return map;
}

SortTokensInput random_sort_input(const SortTokensGen& g, Rng& rng) {
  SortTokensInput in;
  in.T = g.T;
  in.k = g.k;
  in.block_m = g.block_m;
  in.encoding = g.encoding;
  in.E = g.Eg;
  if (g.ep != SortEp::none) {
    in.E = g.E_local >= 0 ? g.E_local : std::max<int64_t>(1, g.Eg / 2);
    std::vector<int32_t> perm(static_cast<size_t>(g.Eg));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    std::vector<int32_t> mask(static_cast<size_t>(g.Eg), 0);
    for (int64_t i = 0; i < in.E; ++i) mask[size_t(perm[size_t(i)])] = 1;
    if (g.ep == SortEp::mask) {
      in.expert_mask = mask;
    } else {
      // A map need not follow the global order: give the kept experts a shuffled local order.
      std::vector<int32_t> locals(static_cast<size_t>(in.E));
      std::iota(locals.begin(), locals.end(), 0);
      std::shuffle(locals.begin(), locals.end(), rng.gen);
      in.expert_map.assign(static_cast<size_t>(g.Eg), -1);
      size_t next = 0;
      for (size_t e = 0; e < mask.size(); ++e) {
        if (mask[e]) in.expert_map[e] = locals[next++];
      }
    }
  }
  const bool distinct = g.distinct && g.k <= g.Eg;
  std::vector<int32_t> pool(static_cast<size_t>(g.Eg));
  in.topk_ids.resize(size_t(g.T * g.k));
  in.topk_weights.resize(size_t(g.T * g.k));
  for (int64_t t = 0; t < g.T; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t j = 0; j < g.k; ++j) {
      int32_t id;
      if (distinct) {  // partial Fisher-Yates: slot j takes a random expert not used by slots < j
        const int64_t pick = rng.integer(j, g.Eg - 1);
        std::swap(pool[size_t(j)], pool[size_t(pick)]);
        id = pool[size_t(j)];
      } else {
        id = int32_t(rng.integer(0, g.Eg - 1));
      }
      if (j == 0 && g.hot_expert >= 0) id = int32_t(g.hot_expert);
      if (g.skip_prob > 0 && rng.uniform(0.0f, 1.0f) < g.skip_prob) id = -1;
      in.topk_ids[size_t(t * g.k + j)] = id;
      in.topk_weights[size_t(t * g.k + j)] = rng.uniform(0.0f, 1.0f);
    }
  }
  return in;
}

SortTokensBuffers::SortTokensBuffers(const SortTokensInput& input)
    : in(input),
      topk_ids(DType::i32, {input.T, input.k}),
      topk_weights(DType::f32, {input.T, input.k}),
      sorted_token_ids(DType::i32, {sort_tokens_max_padded(input.T, input.k, input.E, input.block_m)}),
      sorted_weights(DType::f32, {sort_tokens_max_padded(input.T, input.k, input.E, input.block_m)}),
      sorted_expert_ids(DType::i32, {sort_tokens_max_blocks(input.T, input.k, input.E, input.block_m)}),
      num_valid(DType::i32, {1}) {
  if (!in.topk_ids.empty()) {  // T = 0: data() may be null, which memcpy must not see
    std::memcpy(topk_ids.bytes.data(), in.topk_ids.data(), in.topk_ids.size() * sizeof(int32_t));
    std::memcpy(topk_weights.bytes.data(), in.topk_weights.data(), in.topk_weights.size() * sizeof(float));
  }
  if (!in.expert_mask.empty()) {
    expert_mask = Buffer(DType::i32, {int64_t(in.expert_mask.size())});
    std::memcpy(expert_mask.bytes.data(), in.expert_mask.data(), in.expert_mask.size() * sizeof(int32_t));
  }
  if (!in.expert_map.empty()) {
    expert_map = Buffer(DType::i32, {int64_t(in.expert_map.size())});
    std::memcpy(expert_map.bytes.data(), in.expert_map.data(), in.expert_map.size() * sizeof(int32_t));
  }
}

SortTokensParams SortTokensBuffers::params() {
  auto view = [](Buffer& b) {
    TensorView v = b.view;
    v.data = b.bytes.data();
    return v;
  };
  SortTokensParams p;
  p.topk_ids = view(topk_ids);
  p.topk_weights = view(topk_weights);
  p.num_experts = int(in.E);
  p.block_m = int(in.block_m);
  p.encoding = in.encoding;
  if (!in.expert_mask.empty()) p.expert_mask = view(expert_mask);
  if (!in.expert_map.empty()) p.expert_map = view(expert_map);
  p.sorted_token_ids = view(sorted_token_ids);
  p.sorted_weights = view(sorted_weights);
  p.sorted_expert_ids = view(sorted_expert_ids);
  p.num_valid = view(num_valid);
  return p;
}

void SortTokensBuffers::poison(unsigned char byte) {
  for (Buffer* b : {&sorted_token_ids, &sorted_weights, &sorted_expert_ids, &num_valid}) b->fill_bytes(byte);
}

SortTokensOutput SortTokensBuffers::output() const {
  SortTokensOutput out;
  const auto* ids = sorted_token_ids.data<int32_t>();
  out.sorted_token_ids.assign(ids, ids + sorted_token_ids.numel());
  const auto* w = sorted_weights.data<float>();
  out.sorted_weights.assign(w, w + sorted_weights.numel());
  const auto* e = sorted_expert_ids.data<int32_t>();
  out.sorted_expert_ids.assign(e, e + sorted_expert_ids.numel());
  out.num_valid = num_valid.data<int32_t>()[0];
  return out;
}

namespace {
std::vector<int64_t> widen(const std::vector<int32_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }
std::vector<int64_t> bits(const std::vector<float>& v) {
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    out[i] = int64_t(u);
  }
  return out;
}
}  // namespace

Metrics compare_sort_outputs(const SortTokensOutput& actual, const SortTokensOutput& expected) {
  const struct {
    const char* name;
    Metrics m;
  } parts[] = {
      {"num_valid", compare_exact({actual.num_valid}, {expected.num_valid})},
      {"sorted_token_ids", compare_exact(widen(actual.sorted_token_ids), widen(expected.sorted_token_ids))},
      {"sorted_expert_ids", compare_exact(widen(actual.sorted_expert_ids), widen(expected.sorted_expert_ids))},
      {"sorted_weights (bits)", compare_exact(bits(actual.sorted_weights), bits(expected.sorted_weights))},
  };
  Metrics total;
  for (const auto& part : parts) {
    total.count += part.m.count;
    total.mismatches += part.m.mismatches;
    if (total.worst.empty() && part.m.mismatches > 0) total.worst = std::string(part.name) + ": " + part.m.worst;
  }
  return total;
}

}  // namespace moekit::testing
