// sort_tokens test support (SPEC 2): plain-vector problems, a random problem generator, owning
// buffers for one call, an exact comparison of all four outputs, and the independent oracle the
// reference kernel is checked against. Shared by tests/test_sort_tokens.cpp and
// src/testing/check_sort_tokens.cpp (`moekit check --op sort_tokens`).
//
// The oracle is written differently from src/ops/sort_tokens/sort_tokens_ref.cpp on purpose: it
// collects (local expert, token, slot) triples, std::stable_sort's them by expert, then appends
// each expert's run and its padding one after the other; the reference counts, prefix-sums and
// scatters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/ops/sorting.h"
#include "testing/harness.h"

namespace moekit::testing {

// One sort_tokens problem in plain vectors (see SortTokensParams for the meaning of each field).
struct SortTokensInput {
  int64_t T = 0, k = 1;
  int64_t E = 1;                      // local experts (num_experts)
  int64_t block_m = 1;
  SortEncoding encoding = SortEncoding::packed;
  std::vector<int32_t> topk_ids;      // [T*k] global ids, -1 = none
  std::vector<float> topk_weights;    // [T*k]
  std::vector<int32_t> expert_mask;   // [Eg] 0/1, empty = not given
  std::vector<int32_t> expert_map;    // [Eg] local index or -1, empty = not given
};

// The four outputs, every element (fixed sizes max_padded / max_blocks).
struct SortTokensOutput {
  std::vector<int32_t> sorted_token_ids;   // [max_padded]
  std::vector<float> sorted_weights;       // [max_padded]
  std::vector<int32_t> sorted_expert_ids;  // [max_blocks]
  int32_t num_valid = 0;
};

// The oracle. Expects a valid problem (ids in [-1, Eg), a valid mask or map); the fixed sizes come
// from sort_tokens_max_padded / sort_tokens_max_blocks.
SortTokensOutput oracle_sort_tokens(const SortTokensInput& in);

// Expert-parallel form of a generated problem.
enum class SortEp : uint8_t { none, mask, map };

// Random problem description. Ids are GLOBAL in [0, Eg).
struct SortTokensGen {
  int64_t T = 1, k = 1;
  int64_t Eg = 8;             // experts in the model
  int64_t E_local = -1;       // local experts with ep != none (-1: Eg / 2, at least 1); else Eg
  int64_t block_m = 16;
  SortEncoding encoding = SortEncoding::packed;
  SortEp ep = SortEp::none;
  double skip_prob = 0.0;     // probability that an entry is -1
  bool distinct = true;       // distinct ids per token (like a router); needs k <= Eg
  int64_t hot_expert = -1;    // >= 0: slot 0 of every token routes to this global expert
};
SortTokensInput random_sort_input(const SortTokensGen& g, Rng& rng);

// expert_map equivalent to a mask (local = cumsum(mask) - 1, else -1).
std::vector<int32_t> mask_to_map(const std::vector<int32_t>& mask);

// Owning host buffers for one call, outputs at their fixed sizes.
struct SortTokensBuffers {
  explicit SortTokensBuffers(const SortTokensInput& in);
  SortTokensInput in;
  Buffer topk_ids, topk_weights, expert_mask, expert_map;
  Buffer sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid;

  // Views into the buffers above (rebuilt on each call, so copies of this struct stay valid).
  SortTokensParams params();
  void poison(unsigned char byte);  // fill every output buffer with `byte`
  SortTokensOutput output() const;
};

// Runs `kernel` on a copy of the problem through sort_tokens() (outputs poisoned with 0xAB first, so
// unwritten elements show), on the kernel's device when it has one (DeviceMirror, device workspace
// from sort_tokens_workspace_size); *error_count (optional) gets the error_count output. Defined in
// src/testing/check_sort_tokens.cpp.
Status run_sort_tokens_kernel(const SortTokensInput& in, const Kernel& kernel, SortTokensOutput* out,
                              int32_t* error_count = nullptr);

// Exact compare of every element of every output; weights are compared as bit patterns. Metrics
// count all elements; `worst` names the output of the first mismatch.
Metrics compare_sort_outputs(const SortTokensOutput& actual, const SortTokensOutput& expected);

}  // namespace moekit::testing
