// Tests of sort_tokens (SPEC 2, contract moekit/ops/sorting.h): capacity formula, hand-worked
// examples with every output written out, named edge cases, expert parallelism (mask and map),
// every validation error, outputs untouched on error, random problems against the oracle
// (src/testing/oracle_sort_tokens.cpp) and a structural invariant check, and the check/bench hooks
// on every model preset. Run: ./build/tests/moekit_tests --gtest_filter='SortTokens*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "moekit/core/config.h"
#include "moekit/ops/sorting.h"
#include "testing/harness.h"
#include "testing/oracle_sort_tokens.h"
#include "sort_tokens_test_util.h"

namespace moekit::testing {
namespace {

using sort_test::kRef;
using sort_test::make_input;
using sort_test::run_ref;

constexpr int32_t P24 = 1 << 24;  // one slot step in the packed encoding

// A third formulation of the contract, checked structurally: returns "" when `out` is a valid
// sorting of `in`, else the first violation.
std::string check_invariants(const SortTokensInput& in, const SortTokensOutput& out) {
  const int64_t bm = in.block_m;
  std::vector<int64_t> local(in.expert_mask.empty() && in.expert_map.empty() ? size_t(in.E) : 0);
  for (size_t g = 0; g < local.size(); ++g) local[g] = int64_t(g);
  if (!in.expert_map.empty()) local.assign(in.expert_map.begin(), in.expert_map.end());
  if (!in.expert_mask.empty()) {
    const std::vector<int32_t> m = mask_to_map(in.expert_mask);
    local.assign(m.begin(), m.end());
  }
  const int32_t pad = in.encoding == SortEncoding::packed ? int32_t((in.k << 24) | in.T) : int32_t(in.T * in.k);
  const int64_t nv = out.num_valid;
  if (nv < 0 || nv % bm != 0 || nv > int64_t(out.sorted_token_ids.size())) return "bad num_valid";
  std::map<std::pair<int64_t, int64_t>, int> seen;  // (token, slot) -> times placed
  int64_t prev_expert = -1, prev_key = -1;
  for (int64_t i = 0; i < int64_t(out.sorted_token_ids.size()); ++i) {
    const int32_t v = out.sorted_token_ids[size_t(i)];
    const float w = out.sorted_weights[size_t(i)];
    if (i >= nv || v == pad) {
      if (v != pad || w != 0.0f || std::signbit(w)) return "position " + std::to_string(i) + ": bad padding";
      continue;
    }
    const int64_t t = in.encoding == SortEncoding::packed ? (v & (P24 - 1)) : v / in.k;
    const int64_t j = in.encoding == SortEncoding::packed ? (v >> 24) : v % in.k;
    if (t >= in.T || j >= in.k) return "position " + std::to_string(i) + ": bad entry";
    const int64_t e = out.sorted_expert_ids[size_t(i / bm)];
    const int32_t g = in.topk_ids[size_t(t * in.k + j)];
    if (g < 0 || local[size_t(g)] != e) return "position " + std::to_string(i) + ": wrong expert";
    const int64_t key = t * in.k + j;
    if (e < prev_expert || (e == prev_expert && key <= prev_key)) return "position " + std::to_string(i) + ": order";
    prev_expert = e;
    prev_key = key;
    if (std::memcmp(&w, &in.topk_weights[size_t(key)], 4) != 0) return "position " + std::to_string(i) + ": weight";
    ++seen[{t, j}];
  }
  for (int64_t b = 0; b < int64_t(out.sorted_expert_ids.size()); ++b) {
    const int32_t e = out.sorted_expert_ids[size_t(b)];
    if (b >= nv / bm ? e != -1 : (e < 0 || e >= in.E)) return "block " + std::to_string(b) + ": bad expert id";
    if (b > 0 && b < nv / bm && e < out.sorted_expert_ids[size_t(b - 1)]) return "blocks out of order";
    // A block must hold at least one real entry (experts with no entries get no block).
    if (b < nv / bm && out.sorted_token_ids[size_t(b * bm)] == pad) return "block " + std::to_string(b) + " is empty";
  }
  for (int64_t t = 0; t < in.T; ++t) {
    for (int64_t j = 0; j < in.k; ++j) {
      const int32_t g = in.topk_ids[size_t(t * in.k + j)];
      const int expect = (g >= 0 && local[size_t(g)] >= 0) ? 1 : 0;
      const auto it = seen.find({t, j});
      if ((it == seen.end() ? 0 : it->second) != expect) {
        return "entry (" + std::to_string(t) + ", " + std::to_string(j) + ") placed wrongly";
      }
    }
  }
  return "";
}

// Ref == oracle on every element, and the structural invariants hold.
void expect_matches_oracle(const SortTokensInput& in, const std::string& what) {
  const SortTokensOutput got = run_ref(in);
  const SortTokensOutput want = oracle_sort_tokens(in);
  const Metrics m = compare_sort_outputs(got, want);
  EXPECT_EQ(m.mismatches, 0) << what << ": " << m.worst;
  EXPECT_EQ(check_invariants(in, got), "") << what;
}

void expect_output(const SortTokensOutput& got, const std::vector<int32_t>& ids, const std::vector<float>& w,
                   const std::vector<int32_t>& experts, int32_t num_valid) {
  EXPECT_EQ(got.sorted_token_ids, ids);
  EXPECT_EQ(got.sorted_weights, w);
  EXPECT_EQ(got.sorted_expert_ids, experts);
  EXPECT_EQ(got.num_valid, num_valid);
}

// Expects sort_tokens to fail with invalid_argument and a message containing every `needle`.
void expect_invalid(SortTokensBuffers& b, const SortTokensParams& p, std::initializer_list<const char*> needles) {
  b.poison(0xAB);
  const std::vector<unsigned char> before = b.sorted_token_ids.bytes;
  RunOptions opts;
  opts.kernel = kRef;
  const Status s = sort_tokens(p, opts);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  for (const char* n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
  }
  EXPECT_EQ(b.sorted_token_ids.bytes, before);
}

// ---------------------------------------------------------------- capacity
TEST(SortTokens, MaxPaddedIsTheSpecFormula) {
  EXPECT_EQ(sort_tokens_max_padded(3, 2, 4, 2), 3 * 2 + 4 * 2 - 2);
  EXPECT_EQ(sort_tokens_max_blocks(3, 2, 4, 2), 6);
  EXPECT_EQ(sort_tokens_max_padded(64, 8, 256, 128), 33272);  // DeepSeek-V3
  EXPECT_EQ(sort_tokens_max_blocks(64, 8, 256, 128), 260);     // ceil(33272 / 128)
  EXPECT_EQ(sort_tokens_max_padded(1, 2, 8, 1), 8);
  EXPECT_EQ(sort_tokens_max_blocks(1, 2, 8, 1), 8);
}

TEST(SortTokens, MaxPaddedTinyCases) {
  EXPECT_EQ(sort_tokens_max_padded(0, 2, 4, 16), 62);  // T = 0: the formula itself
  EXPECT_EQ(sort_tokens_max_padded(0, 8, 1, 1), 0);    // formula -7: clamped at 0
  EXPECT_EQ(sort_tokens_max_blocks(0, 8, 1, 1), 0);
  // E < k: a token may repeat a local expert, worst case T*k + E*(block_m - 1) beats the formula.
  EXPECT_EQ(sort_tokens_max_padded(1, 8, 2, 1), 8);
  EXPECT_EQ(sort_tokens_max_padded(1, 8, 2, 4), 14);
  EXPECT_EQ(sort_tokens_max_blocks(1, 8, 2, 4), 4);
  // ... and the buffer really is needed: 8 entries on expert 0 ( + 0 on 1) with block_m 1.
  expect_matches_oracle(make_input(1, 8, 2, 1, SortEncoding::flat, {0, 0, 0, 0, 0, 0, 0, 0}), "E<k");
  expect_matches_oracle(make_input(1, 8, 2, 4, SortEncoding::packed, {0, 1, 0, 1, 0, 1, 0, 0}), "E<k bm4");
}

// ---------------------------------------------------------------- hand-worked examples
// T=3 k=2 E=4 block_m=2; ids [[2,0],[0,3],[2,0]]. Expert 0: (0,1) (1,0) (2,1) + pad; expert 1:
// nothing, no block; expert 2: (0,0) (2,0); expert 3: (1,1) + pad. num_valid 8, max_padded 12,
// max_blocks 6.
const std::vector<int32_t> kHandIds = {2, 0, 0, 3, 2, 0};
const std::vector<float> kHandW = {0.5f, 0.25f, 0.75f, 0.125f, 1.0f, 2.0f};

TEST(SortTokens, HandWorkedPacked) {
  const int32_t P = (2 << 24) | 3;
  const SortTokensOutput got = run_ref(make_input(3, 2, 4, 2, SortEncoding::packed, kHandIds, kHandW));
  expect_output(got, {P24 | 0, 1, P24 | 2, P, 0, 2, P24 | 1, P, P, P, P, P},
                {0.25f, 0.75f, 2.0f, 0, 0.5f, 1.0f, 0.125f, 0, 0, 0, 0, 0}, {0, 0, 2, 3, -1, -1}, 8);
}

TEST(SortTokens, HandWorkedFlat) {
  const SortTokensOutput got = run_ref(make_input(3, 2, 4, 2, SortEncoding::flat, kHandIds, kHandW));
  expect_output(got, {1, 2, 5, 6, 0, 4, 3, 6, 6, 6, 6, 6},
                {0.25f, 0.75f, 2.0f, 0, 0.5f, 1.0f, 0.125f, 0, 0, 0, 0, 0}, {0, 0, 2, 3, -1, -1}, 8);
}

// Eg=6, mask [0,1,1,0,1,0] -> E=3 (global 1->0, 2->1, 4->2); T=2 k=3 block_m=2;
// ids [[4,1,0],[-1,4,5]]: 0 and 5 are remote, -1 skipped. Local 0: (0,1) + pad; local 1: none;
// local 2: (0,0) (1,1). max_padded 2*3 + 3*2 - 3 = 9, max_blocks 5.
SortTokensInput hand_ep_input() {
  SortTokensInput in = make_input(2, 3, 3, 2, SortEncoding::flat, {4, 1, 0, -1, 4, 5}, {1, 2, 3, 4, 5, 6});
  in.expert_mask = {0, 1, 1, 0, 1, 0};
  return in;
}

TEST(SortTokens, HandWorkedExpertMask) {
  expect_output(run_ref(hand_ep_input()), {1, 6, 0, 4, 6, 6, 6, 6, 6}, {2, 0, 1, 5, 0, 0, 0, 0, 0},
                {0, 2, -1, -1, -1}, 4);
}

TEST(SortTokens, HandWorkedExpertMapOwnLocalOrder) {
  SortTokensInput in = hand_ep_input();
  in.expert_mask.clear();
  in.expert_map = {-1, 2, 0, -1, 1, -1};  // global 1 -> local 2, global 4 -> local 1
  expect_output(run_ref(in), {0, 4, 1, 6, 6, 6, 6, 6, 6}, {1, 5, 2, 0, 0, 0, 0, 0, 0}, {1, 2, -1, -1, -1}, 4);
}

// ---------------------------------------------------------------- edge cases
TEST(SortTokens, TZeroWritesNumValidAndPadding) {
  const SortTokensInput in = make_input(0, 2, 4, 16, SortEncoding::packed, {});
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(got.num_valid, 0);
  ASSERT_EQ(got.sorted_token_ids.size(), 62u);
  for (int32_t v : got.sorted_token_ids) EXPECT_EQ(v, 2 << 24);  // (k << 24) | T with T = 0
  for (float w : got.sorted_weights) EXPECT_EQ(w, 0.0f);
  EXPECT_EQ(got.sorted_expert_ids, std::vector<int32_t>(4, -1));
  EXPECT_EQ(run_ref(make_input(0, 2, 4, 16, SortEncoding::flat, {})).sorted_token_ids, std::vector<int32_t>(62, 0));
}

TEST(SortTokens, TZeroWithZeroCapacity) {
  const SortTokensOutput got = run_ref(make_input(0, 8, 1, 1, SortEncoding::packed, {}));
  EXPECT_EQ(got.num_valid, 0);
  EXPECT_TRUE(got.sorted_token_ids.empty());
  EXPECT_TRUE(got.sorted_expert_ids.empty());
}

TEST(SortTokens, OneToken) {
  const SortTokensOutput got = run_ref(make_input(1, 2, 8, 4, SortEncoding::packed, {5, 3}, {0.6f, 0.4f}));
  const int32_t P = (2 << 24) | 1;
  EXPECT_EQ(got.num_valid, 8);
  EXPECT_EQ(got.sorted_expert_ids, (std::vector<int32_t>{3, 5, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(got.sorted_token_ids.begin(), got.sorted_token_ids.begin() + 8),
            (std::vector<int32_t>{P24 | 0, P, P, P, 0, P, P, P}));
}

TEST(SortTokens, KOneAndKEqualsE) {
  Rng rng(11);
  for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
    SortTokensGen g;
    g.T = 9;
    g.Eg = 5;
    g.encoding = enc;
    g.block_m = 4;
    g.k = 1;
    expect_matches_oracle(random_sort_input(g, rng), "k=1");
    g.k = 5;  // every token uses every expert
    const SortTokensInput in = random_sort_input(g, rng);
    const SortTokensOutput got = run_ref(in);
    EXPECT_EQ(got.num_valid, 5 * 12);  // 9 entries per expert, padded to 12
    expect_matches_oracle(in, "k=E");
  }
}

TEST(SortTokens, MoreExpertsThanTokensAndENotPowerOfTwo) {
  Rng rng(12);
  for (int64_t Eg : {7, 13, 100}) {
    SortTokensGen g;
    g.T = 3;
    g.k = 2;
    g.Eg = Eg;
    g.block_m = 3;
    expect_matches_oracle(random_sort_input(g, rng), "Eg=" + std::to_string(Eg));
  }
}

TEST(SortTokens, AllTokensToOneExpert) {
  std::vector<int32_t> ids(37, 3);
  const SortTokensOutput got = run_ref(make_input(37, 1, 6, 16, SortEncoding::flat, ids));
  EXPECT_EQ(got.num_valid, 48);
  // max_padded 37 + 6*16 - 1 = 132, max_blocks ceil(132 / 16) = 9
  EXPECT_EQ(got.sorted_expert_ids, (std::vector<int32_t>{3, 3, 3, -1, -1, -1, -1, -1, -1}));
}

TEST(SortTokens, EmptyExpertsGetNoBlock) {
  // Experts 0, 2, 4 used; 1, 3, 5, 6, 7 empty.
  const SortTokensOutput got = run_ref(make_input(3, 2, 8, 2, SortEncoding::packed, {4, 0, 2, 4, 0, 2}));
  EXPECT_EQ(got.num_valid, 6);
  EXPECT_EQ(std::vector<int32_t>(got.sorted_expert_ids.begin(), got.sorted_expert_ids.begin() + 4),
            (std::vector<int32_t>{0, 2, 4, -1}));
}

TEST(SortTokens, BlockMOneHasNoPadding) {
  const SortTokensInput in = make_input(4, 2, 3, 1, SortEncoding::flat, {0, 1, 2, 0, -1, 1, 2, 2});
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(got.num_valid, 7);
  EXPECT_EQ(std::vector<int32_t>(got.sorted_token_ids.begin(), got.sorted_token_ids.begin() + 7),
            (std::vector<int32_t>{0, 3, 1, 5, 2, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(got.sorted_expert_ids.begin(), got.sorted_expert_ids.begin() + 8),
            (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 2, -1}));
}

TEST(SortTokens, BlockMLargerThanAllEntries) {
  const SortTokensInput in = make_input(2, 2, 4, 128, SortEncoding::packed, {1, 3, 3, 1});
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(got.num_valid, 256);
  EXPECT_EQ(got.sorted_expert_ids, (std::vector<int32_t>{1, 3, -1, -1, -1}));  // ceil(514 / 128) = 5
  expect_matches_oracle(in, "block_m > T*k");
}

TEST(SortTokens, SkippedIds) {
  const SortTokensOutput some = run_ref(make_input(3, 2, 4, 2, SortEncoding::flat, {-1, 1, 1, -1, -1, -1}));
  EXPECT_EQ(some.num_valid, 2);
  EXPECT_EQ(std::vector<int32_t>(some.sorted_token_ids.begin(), some.sorted_token_ids.begin() + 3),
            (std::vector<int32_t>{1, 2, 6}));
  const SortTokensOutput all = run_ref(make_input(3, 2, 4, 2, SortEncoding::packed, std::vector<int32_t>(6, -1)));
  EXPECT_EQ(all.num_valid, 0);
  for (int32_t v : all.sorted_token_ids) EXPECT_EQ(v, (2 << 24) | 3);
  for (int32_t e : all.sorted_expert_ids) EXPECT_EQ(e, -1);
}

TEST(SortTokens, ExpertMaskRemoteExpertsDropped) {
  // Eg=8, local = globals 2, 5, 7 (local 0, 1, 2). Ids are global.
  SortTokensInput in = make_input(4, 2, 3, 1, SortEncoding::flat, {5, 0, 7, 2, 1, 3, 2, 5});
  in.expert_mask = {0, 0, 1, 0, 0, 1, 0, 1};
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(got.num_valid, 5);
  EXPECT_EQ(std::vector<int32_t>(got.sorted_token_ids.begin(), got.sorted_token_ids.begin() + 5),
            (std::vector<int32_t>{3, 6, 0, 7, 2}));
  EXPECT_EQ(std::vector<int32_t>(got.sorted_expert_ids.begin(), got.sorted_expert_ids.begin() + 6),
            (std::vector<int32_t>{0, 0, 1, 1, 2, -1}));
  expect_matches_oracle(in, "mask");
}

TEST(SortTokens, ExpertMapEqualsEquivalentMask) {
  Rng rng(21);
  for (int seed = 0; seed < 4; ++seed) {
    SortTokensGen g;
    g.T = 20;
    g.k = 3;
    g.Eg = 10;
    g.E_local = 4;
    g.ep = SortEp::mask;
    g.block_m = 4;
    SortTokensInput with_mask = random_sort_input(g, rng);
    SortTokensInput with_map = with_mask;
    with_map.expert_map = mask_to_map(with_mask.expert_mask);
    with_map.expert_mask.clear();
    const Metrics m = compare_sort_outputs(run_ref(with_map), run_ref(with_mask));
    EXPECT_EQ(m.mismatches, 0) << m.worst;
  }
}

TEST(SortTokens, TokenWithAllExpertsRemote) {
  SortTokensInput in = make_input(3, 2, 2, 2, SortEncoding::packed, {1, 3, 0, 2, 3, 1});
  in.expert_map = {-1, 0, -1, 1};  // token 1 routes to 0 and 2, both remote
  const SortTokensOutput got = run_ref(in);
  const int32_t P = (2 << 24) | 3;
  EXPECT_EQ(got.num_valid, 4);
  EXPECT_EQ(got.sorted_token_ids, (std::vector<int32_t>{0, P24 | 2, P24 | 0, 2, P, P, P, P}));
  EXPECT_EQ(got.sorted_expert_ids, (std::vector<int32_t>{0, 1, -1, -1}));
  expect_matches_oracle(in, "all remote");
}

TEST(SortTokens, DuplicateExpertInOneRowGivesTwoEntries) {
  const SortTokensInput in = make_input(2, 3, 4, 4, SortEncoding::flat, {2, 2, 1, 2, 0, 2});
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(got.num_valid, 12);
  EXPECT_EQ(std::vector<int32_t>(got.sorted_token_ids.begin(), got.sorted_token_ids.begin() + 12),
            (std::vector<int32_t>{4, 6, 6, 6, 2, 6, 6, 6, 0, 1, 3, 5}));
  EXPECT_EQ(std::vector<int32_t>(got.sorted_expert_ids.begin(), got.sorted_expert_ids.begin() + 4),
            (std::vector<int32_t>{0, 1, 2, -1}));
}

TEST(SortTokens, WeightsAreCopiedBitExactly) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const SortTokensInput in = make_input(2, 2, 2, 2, SortEncoding::packed, {0, 1, 1, 0}, {-0.0f, nan, 1e-45f, -3.5f});
  const SortTokensOutput got = run_ref(in);
  EXPECT_EQ(compare_sort_outputs(got, oracle_sort_tokens(in)).mismatches, 0);
  EXPECT_TRUE(std::signbit(got.sorted_weights[0]));
  EXPECT_TRUE(std::isnan(got.sorted_weights[2]));
}

TEST(SortTokens, PackedEncodingAtLargestK) {
  std::vector<int32_t> ids(2 * 127);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 127);
  const SortTokensInput in = make_input(2, 127, 127, 1, SortEncoding::packed, ids);
  const SortTokensOutput got = run_ref(in);
  // Token t slot j routes to expert j: expert e holds (0, e), (1, e); no padding at block_m 1.
  EXPECT_EQ(got.sorted_token_ids[1], 1);
  EXPECT_EQ(got.sorted_token_ids[253], (126 << 24) | 1);
  EXPECT_EQ(got.num_valid, 254);
  expect_matches_oracle(in, "k=127");
}

// ---------------------------------------------------------------- validation
TEST(SortTokens, RejectsIdOutOfRange) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::packed, {0, 1, 2, 4, 3, 3}));
  expect_invalid(b, b.params(), {"topk_ids", "token 1", "slot 1", "expert id 4", "Eg=4"});
  b.topk_ids.data<int32_t>()[3] = -2;
  expect_invalid(b, b.params(), {"topk_ids", "token 1", "slot 1", "expert id -2"});
}

TEST(SortTokens, RejectsIdAtEgWithMask) {
  SortTokensInput in = hand_ep_input();
  in.topk_ids[5] = 6;  // Eg = 6; 4 is fine although E = 3
  SortTokensBuffers b(in);
  expect_invalid(b, b.params(), {"topk_ids", "token 1", "slot 2", "expert id 6", "Eg=6"});
}

TEST(SortTokens, RejectsBadMaskAndMap) {
  SortTokensBuffers b(hand_ep_input());
  b.expert_mask.data<int32_t>()[0] = 2;
  expect_invalid(b, b.params(), {"expert_mask", "0 or 1", "got 2"});
  b.expert_mask.data<int32_t>()[0] = 1;  // sum 4 != E 3
  expect_invalid(b, b.params(), {"expert_mask", "num_experts=3", "got 4"});

  SortTokensInput in = hand_ep_input();
  in.expert_map = mask_to_map(in.expert_mask);
  SortTokensBuffers both(in);
  expect_invalid(both, both.params(), {"expert_mask", "expert_map"});

  in.expert_mask.clear();
  SortTokensBuffers m(in);
  m.expert_map.data<int32_t>()[0] = 3;
  expect_invalid(m, m.params(), {"expert_map", "[-1, num_experts=3)", "got 3"});
  m.expert_map.data<int32_t>()[0] = -2;
  expect_invalid(m, m.params(), {"expert_map", "got -2"});
  m.expert_map.data<int32_t>()[0] = 2;  // global 4 is local 2 as well
  expect_invalid(m, m.params(), {"expert_map", "local index 2", "expert 0", "expert 4"});
}

TEST(SortTokens, RejectsBadScalars) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::packed, kHandIds));
  SortTokensParams p = b.params();
  p.block_m = 0;
  expect_invalid(b, p, {"block_m", "got 0"});
  p = b.params();
  p.num_experts = 0;
  expect_invalid(b, p, {"num_experts", "got 0"});
  p = b.params();
  p.encoding = static_cast<SortEncoding>(7);
  expect_invalid(b, p, {"encoding", "got 7"});
}

TEST(SortTokens, RejectsWrongOutputSizes) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::packed, kHandIds));
  Buffer short_ids(DType::i32, {11}), short_w(DType::f32, {13}), blocks(DType::i32, {5}), nv(DType::i32, {2});
  SortTokensParams p = b.params();
  p.sorted_token_ids = short_ids.view;
  expect_invalid(b, p, {"sorted_token_ids", "[12]", "got [11]"});
  p = b.params();
  p.sorted_weights = short_w.view;
  expect_invalid(b, p, {"sorted_weights", "[12]", "got [13]"});
  p = b.params();
  p.sorted_expert_ids = blocks.view;
  expect_invalid(b, p, {"sorted_expert_ids", "[6]", "got [5]"});
  p = b.params();
  p.num_valid = nv.view;
  expect_invalid(b, p, {"num_valid", "[1]", "got [2]"});
  p = b.params();
  p.num_valid = TensorView();
  expect_invalid(b, p, {"num_valid", "required"});
}

TEST(SortTokens, RejectsWrongDtypesShapesAndStrides) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::packed, kHandIds));
  SortTokensParams p = b.params();
  p.topk_ids.dtype = DType::f32;
  expect_invalid(b, p, {"topk_ids", "dtype must be i32", "got f32"});
  p = b.params();
  p.topk_weights.dtype = DType::bf16;
  expect_invalid(b, p, {"topk_weights", "dtype must be f32", "got bf16"});
  p = b.params();
  p.sorted_weights.dtype = DType::i32;
  expect_invalid(b, p, {"sorted_weights", "dtype must be f32"});
  p = b.params();
  p.sorted_token_ids.dtype = DType::f32;
  expect_invalid(b, p, {"sorted_token_ids", "dtype must be i32"});
  p = b.params();
  p.topk_weights.shape[1] = 1;
  expect_invalid(b, p, {"topk_weights", "[3, 2]", "got [3, 1]"});
  p = b.params();
  p.topk_ids.stride[0] = 3;  // rows of a wider buffer: not contiguous
  expect_invalid(b, p, {"topk_ids", "contiguous"});
  p = b.params();
  p.topk_ids.shape[1] = 0;
  p.topk_weights.shape[1] = 0;
  expect_invalid(b, p, {"topk_ids", "k (dim 1)", "got 0"});
  p = b.params();
  p.topk_weights.device = Device::cuda;
  expect_invalid(b, p, {"topk_weights", "cuda"});
}

TEST(SortTokens, RejectsEncodingLimits) {
  SortTokensBuffers b(make_input(1, 128, 1, 1, SortEncoding::packed, std::vector<int32_t>(128, 0)));
  expect_invalid(b, b.params(), {"topk_ids", "packed", "k=127", "got k=128"});
  SortTokensInput flat = make_input(1, 128, 1, 1, SortEncoding::flat, std::vector<int32_t>(128, 0));
  expect_matches_oracle(flat, "flat k=128");
  // T = 2^24 tokens: refused from the shapes alone, before any data is read (views over a dummy).
  int32_t dummy = 0;
  SortTokensParams p = b.params();
  p.topk_ids = TensorView::contiguous(&dummy, DType::i32, {int64_t(1) << 24, 1});
  p.topk_weights = TensorView::contiguous(&dummy, DType::f32, {int64_t(1) << 24, 1});
  expect_invalid(b, p, {"topk_ids", "packed", "T=16777215", "got T=16777216"});
  p.encoding = SortEncoding::flat;
  p.topk_ids = TensorView::contiguous(&dummy, DType::i32, {int64_t(1) << 30, 2});
  p.topk_weights = TensorView::contiguous(&dummy, DType::f32, {int64_t(1) << 30, 2});
  expect_invalid(b, p, {"topk_ids", "T*k"});
}

TEST(SortTokens, RefRefusesDeviceTensors) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::packed, kHandIds));
  SortTokensParams p = b.params();
  for (TensorView* t : {&p.topk_ids, &p.topk_weights, &p.sorted_token_ids, &p.sorted_weights,
                        &p.sorted_expert_ids, &p.num_valid}) {
    t->device = Device::cuda;
  }
  ASSERT_TRUE(validate_sort_tokens(p).ok());  // device data is not scanned on the host
  RunOptions opts;
  opts.kernel = kRef;
  const Status s = sort_tokens(p, opts);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.message();
}

TEST(SortTokens, InvalidIdLeavesEveryOutputUnchanged) {
  SortTokensBuffers b(make_input(3, 2, 4, 2, SortEncoding::flat, {0, 1, 2, 3, 1, 9}));
  b.poison(0xAB);
  const SortTokensBuffers before = b;
  RunOptions opts;
  opts.kernel = kRef;
  EXPECT_FALSE(sort_tokens(b.params(), opts).ok());
  // The kernel's own pre-scan too, called directly without the front door's validation.
  const Kernel* k = registry().find(kRef);
  ASSERT_NE(k, nullptr);
  const SortTokensParams p = b.params();
  const Status s = k->run(&p, RunContext{});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("token 2 slot 1 has expert id 9"), std::string::npos) << s.message();
  EXPECT_EQ(b.sorted_token_ids.bytes, before.sorted_token_ids.bytes);
  EXPECT_EQ(b.sorted_weights.bytes, before.sorted_weights.bytes);
  EXPECT_EQ(b.sorted_expert_ids.bytes, before.sorted_expert_ids.bytes);
  EXPECT_EQ(b.num_valid.bytes, before.num_valid.bytes);
}

// ---------------------------------------------------------------- random vs oracle
TEST(SortTokens, RandomAgainstOracle) {
  struct Shape {
    int64_t T, k, Eg, bm;
  };
  const Shape shapes[] = {{1, 1, 1, 1}, {5, 2, 8, 16}, {33, 8, 64, 4}, {64, 8, 256, 128}, {100, 6, 60, 64},
                          {17, 3, 7, 5}, {200, 1, 128, 16}, {9, 4, 3, 2}};
  int n = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Rng rng(seed);
    for (const Shape& s : shapes) {
      for (SortEp ep : {SortEp::none, SortEp::mask, SortEp::map}) {
        SortTokensGen g;
        g.T = s.T;
        g.k = s.k;
        g.Eg = s.Eg;
        g.block_m = s.bm;
        g.ep = ep;
        g.encoding = (n % 2) ? SortEncoding::flat : SortEncoding::packed;
        g.skip_prob = (n % 3 == 0) ? 0.2 : 0.0;
        g.distinct = n % 5 != 0;
        ++n;
        expect_matches_oracle(random_sort_input(g, rng), "seed " + std::to_string(seed) + " " + std::to_string(n));
      }
    }
  }
}

TEST(SortTokens, DefaultDispatchMatchesOracle) {
  Rng rng(5);
  SortTokensGen g;
  g.T = 50;
  g.k = 4;
  g.Eg = 16;
  const SortTokensInput in = random_sort_input(g, rng);
  SortTokensBuffers b(in);
  ASSERT_TRUE(sort_tokens(b.params()).ok());
  EXPECT_EQ(compare_sort_outputs(b.output(), oracle_sort_tokens(in)).mismatches, 0);
}

// ---------------------------------------------------------------- check / bench hooks
TEST(SortTokens, CheckHarnessAllPresets) {
  for (const char* model : {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}) {
    CheckRequest req;
    req.shape.model = model;
    const std::vector<CaseResult> results = check_sort_tokens(req);
    EXPECT_GE(results.size(), 40u) << model;
    for (const CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " " << r.kernel << " " << r.name << ": " << r.detail;
      const bool skipped = r.detail.rfind("skipped", 0) == 0;  // e.g. a CUDA kernel without a device
      if (!skipped) {
        EXPECT_GT(r.metrics.count, 0) << r.name;
      }
    }
  }
}

TEST(SortTokens, CheckHarnessCustomShape) {
  CheckRequest req;
  req.shape.experts = 7;
  req.shape.topk = 3;
  req.tokens = {0, 3, 100};
  req.edge_cases = false;
  const std::vector<CaseResult> results = check_sort_tokens(req);
  EXPECT_EQ(results.size(), 33u * kernels_to_check(OpKind::sort_tokens, req).size());
  for (const CaseResult& r : results) EXPECT_TRUE(r.ok) << r.name << ": " << r.detail;
}

TEST(SortTokens, BenchProblemRuns) {
  BenchRequest req;
  req.shape.model = "qwen3-moe";
  const Kernel* k = registry().find(kRef);
  ASSERT_NE(k, nullptr);
  std::unique_ptr<BenchProblem> prob;
  ASSERT_TRUE(bench_sort_tokens(req, 64, *k, &prob).ok());
  EXPECT_TRUE(prob->run().ok());
  EXPECT_GT(prob->bytes, 0);
  EXPECT_NE(prob->shape.find("block_m=64"), std::string::npos) << prob->shape;
}


// ---------------------------------------------------------------- error_count (host)
TEST(SortTokens, RefWritesZeroErrorCount) {
  SortTokensBuffers b(make_input(2, 2, 4, 2, SortEncoding::flat, {0, 1, -1, 3}));
  Buffer err(DType::i32, {1});
  err.fill_bytes(0xAB);
  SortTokensParams p = b.params();
  p.error_count = err.view;
  RunOptions opts;
  opts.kernel = kRef;
  ASSERT_TRUE(sort_tokens(p, opts).ok());
  EXPECT_EQ(err.data<int32_t>()[0], 0);
}

TEST(SortTokens, RejectsBadErrorCount) {
  SortTokensBuffers b(make_input(2, 2, 4, 2, SortEncoding::flat, {0, 1, 2, 3}));
  b.poison(0xAB);
  const SortTokensBuffers before = b;
  Buffer err2(DType::i32, {2});
  Buffer errf(DType::f32, {1});
  SortTokensParams p = b.params();
  p.error_count = err2.view;
  Status s = sort_tokens(p, {});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("error_count"), std::string::npos) << s.message();
  p.error_count = errf.view;
  s = sort_tokens(p, {});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("error_count"), std::string::npos) << s.message();
  EXPECT_EQ(b.sorted_token_ids.bytes, before.sorted_token_ids.bytes);
  EXPECT_EQ(b.num_valid.bytes, before.num_valid.bytes);
}

TEST(SortTokens, WorkspaceSizeIsZeroForTheRefKernel) {
  SortTokensBuffers b(make_input(2, 2, 4, 2, SortEncoding::flat, {0, 1, 2, 3}));
  RunOptions opts;
  opts.kernel = kRef;
  size_t bytes = 123;
  ASSERT_TRUE(sort_tokens_workspace_size(b.params(), opts, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  SortTokensParams bad = b.params();
  bad.block_m = 0;
  const Status s = sort_tokens_workspace_size(bad, opts, &bytes);
  EXPECT_NE(s.message().find("block_m"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moekit::testing
