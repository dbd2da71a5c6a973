// sort_tokens front door (SPEC 2): validate -> select -> run. Contract: moekit/ops/sorting.h.
// Test: tests/test_sort_tokens.cpp (suite SortTokens).
//
// Validation is complete before any kernel runs: shapes, dtypes, contiguity, devices, the
// encoding's integer limits, and, for host-resident tensors, the data (mask values and sum, map
// range and injectivity, every topk id in [-1, Eg)). Device data is checked by the device kernel.
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "moekit/ops/sorting.h"

namespace moekit {

const char* sort_encoding_name(SortEncoding e) {
  switch (e) {
    case SortEncoding::packed: return "packed";
    case SortEncoding::flat: return "flat";
  }
  return "?";
}

namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

// 1-D [*] i32 contiguous tensor on the same device as topk_ids (expert_mask / expert_map).
Status check_expert_table(const SortTokensParams& p, const TensorView& t, const char* name) {
  MOEKIT_RETURN_IF_ERROR(check::present(t, name));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(t, name, {DType::i32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(t, name, {-1}));
  if (t.shape[0] < 1) return InvalidArgument(name, ": must have Eg >= 1 entries, got ", t.shape[0]);
  if (t.shape[0] > kI32Max) return InvalidArgument(name, ": Eg must be <= 2^31 - 1, got ", t.shape[0]);
  MOEKIT_RETURN_IF_ERROR(check::contiguous(t, name));
  return check::same_device(p.topk_ids, "topk_ids", t, name);
}

Status check_output(const SortTokensParams& p, const TensorView& t, const char* name, DType dtype,
                    int64_t size) {
  MOEKIT_RETURN_IF_ERROR(check::present(t, name));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(t, name, {dtype}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(t, name, {size}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(t, name));
  return check::same_device(p.topk_ids, "topk_ids", t, name);
}

// Data checks of the mask / map (host only): mask values 0/1 summing to E; map values in [-1, E),
// non-negative values distinct.
Status check_expert_table_data(const SortTokensParams& p) {
  const int64_t E = p.num_experts;
  if (p.expert_mask.present()) {
    const int32_t* m = p.expert_mask.ptr<int32_t>();
    int64_t sum = 0;
    for (int64_t e = 0; e < p.expert_mask.shape[0]; ++e) {
      if (m[e] != 0 && m[e] != 1) {
        return InvalidArgument("expert_mask: values must be 0 or 1, got ", m[e], " at expert ", e);
      }
      sum += m[e];
    }
    if (sum != E) {
      return InvalidArgument("expert_mask: sum (number of local experts) must equal num_experts=", E,
                             ", got ", sum);
    }
  }
  if (p.expert_map.present()) {
    const int32_t* m = p.expert_map.ptr<int32_t>();
    std::vector<int64_t> owner;  // global expert holding each local slot
    try {
      owner.assign(static_cast<size_t>(E), -1);
    } catch (const std::bad_alloc&) {
      return OutOfMemory("expert_map: checking num_experts=", E, " local slots needs ", E * 8, " bytes of host memory");
    }
    for (int64_t e = 0; e < p.expert_map.shape[0]; ++e) {
      if (m[e] < -1 || m[e] >= E) {
        return InvalidArgument("expert_map: values must be in [-1, num_experts=", E, "), got ", m[e],
                               " at expert ", e);
      }
      if (m[e] < 0) continue;
      int64_t& o = owner[static_cast<size_t>(m[e])];
      if (o >= 0) {
        return InvalidArgument("expert_map: local index ", m[e], " is given to both expert ", o,
                               " and expert ", e, " (local indices must be distinct)");
      }
      o = e;
    }
  }
  return Status::Ok();
}

// Every id must be -1 or in [0, Eg) (host only).
Status check_ids_data(const SortTokensParams& p, int64_t Eg) {
  const int64_t T = p.topk_ids.shape[0], k = p.topk_ids.shape[1];
  const int32_t* ids = p.topk_ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids[t * k + j];
      if (id != -1 && (id < 0 || id >= Eg)) {
        return InvalidArgument("topk_ids: token ", t, " slot ", j, " has expert id ", id,
                               ", outside [0, Eg=", Eg, ") (-1 means no expert)");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status validate_sort_tokens(const SortTokensParams& p) {
  MOEKIT_RETURN_IF_ERROR(check::present(p.topk_ids, "topk_ids"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.topk_ids, "topk_ids", {DType::i32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.topk_ids, "topk_ids", {-1, -1}));
  const int64_t T = p.topk_ids.shape[0], k = p.topk_ids.shape[1];
  if (k < 1) return InvalidArgument("topk_ids: k (dim 1) must be >= 1, got ", k);
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.topk_ids, "topk_ids"));
  if (T > kI32Max || k > kI32Max || T * k > kI32Max) {
    return InvalidArgument("topk_ids: T*k must be <= 2^31 - 1, got T=", T, " k=", k);
  }
  MOEKIT_RETURN_IF_ERROR(check::present(p.topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.topk_weights, "topk_weights", {DType::f32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.topk_weights, "topk_weights", {T, k}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.topk_ids, "topk_ids", p.topk_weights, "topk_weights"));

  if (p.num_experts < 1) return InvalidArgument("num_experts: must be >= 1, got ", p.num_experts);
  if (p.block_m < 1) return InvalidArgument("block_m: must be >= 1, got ", p.block_m);
  if (p.encoding != SortEncoding::packed && p.encoding != SortEncoding::flat) {
    return InvalidArgument("encoding: must be packed or flat, got ", int(p.encoding));
  }
  if (p.encoding == SortEncoding::packed) {
    if (T > kSortPackedMaxTokens) {
      return InvalidArgument("topk_ids: the packed encoding holds at most T=", kSortPackedMaxTokens,
                             " tokens (24 bits), got T=", T, "; use the flat encoding");
    }
    if (k > kSortPackedMaxTopk) {
      return InvalidArgument("topk_ids: the packed encoding holds at most k=", kSortPackedMaxTopk,
                             " (padding (k << 24) | T must fit in i32), got k=", k);
    }
  }

  // Eg: the global expert count the ids index, given by the mask / map (else Eg == E).
  int64_t Eg = p.num_experts;
  if (p.expert_mask.present() && p.expert_map.present()) {
    return InvalidArgument("expert_mask: must not be given together with expert_map (pass one form of "
                           "the expert-parallel table)");
  }
  if (p.expert_mask.present()) {
    MOEKIT_RETURN_IF_ERROR(check_expert_table(p, p.expert_mask, "expert_mask"));
    Eg = p.expert_mask.shape[0];
  } else if (p.expert_map.present()) {
    MOEKIT_RETURN_IF_ERROR(check_expert_table(p, p.expert_map, "expert_map"));
    Eg = p.expert_map.shape[0];
  }

  const int64_t max_padded = sort_tokens_max_padded(T, k, p.num_experts, p.block_m);
  if (max_padded > kI32Max) {
    return InvalidArgument("num_experts: max_padded = T*k + E*block_m - k must be <= 2^31 - 1, got ",
                           max_padded, " (T=", T, " k=", k, " E=", p.num_experts, " block_m=", p.block_m, ")");
  }
  const int64_t max_blocks = sort_tokens_max_blocks(T, k, p.num_experts, p.block_m);
  MOEKIT_RETURN_IF_ERROR(check_output(p, p.sorted_token_ids, "sorted_token_ids", DType::i32, max_padded));
  MOEKIT_RETURN_IF_ERROR(check_output(p, p.sorted_weights, "sorted_weights", DType::f32, max_padded));
  MOEKIT_RETURN_IF_ERROR(check_output(p, p.sorted_expert_ids, "sorted_expert_ids", DType::i32, max_blocks));
  MOEKIT_RETURN_IF_ERROR(check_output(p, p.num_valid, "num_valid", DType::i32, 1));
  if (p.error_count.present()) {
    MOEKIT_RETURN_IF_ERROR(check_output(p, p.error_count, "error_count", DType::i32, 1));
  }
  MOEKIT_RETURN_IF_ERROR(check::outputs_disjoint(
      {{&p.sorted_token_ids, "sorted_token_ids"}, {&p.sorted_weights, "sorted_weights"},
       {&p.sorted_expert_ids, "sorted_expert_ids"}, {&p.num_valid, "num_valid"}, {&p.error_count, "error_count"}},
      {{&p.topk_ids, "topk_ids"}, {&p.topk_weights, "topk_weights"}, {&p.expert_mask, "expert_mask"},
       {&p.expert_map, "expert_map"}}));

  // Data checks, only where the data is readable here.
  if (p.topk_ids.device == Device::cpu) {
    MOEKIT_RETURN_IF_ERROR(check_expert_table_data(p));
    MOEKIT_RETURN_IF_ERROR(check_ids_data(p, Eg));
  }
  return Status::Ok();
}

namespace {
std::string shape_key(const SortTokensParams& p) {
  std::ostringstream key;
  key << "T=" << p.topk_ids.shape[0] << " k=" << p.topk_ids.shape[1] << " E=" << p.num_experts
      << " block_m=" << p.block_m << ' ' << sort_encoding_name(p.encoding)
      << (p.expert_mask.present() ? " mask" : "") << (p.expert_map.present() ? " map" : "");
  return key.str();
}
}  // namespace

Status sort_tokens(const SortTokensParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_sort_tokens(p));
  // NOTE: no early return for T = 0. num_valid [1] and the padded outputs exist even then, and a
  // consumer reads num_valid: the kernel writes 0 there and fills the padding.
  return dispatch(OpKind::sort_tokens, MoeVariant::none, &p, opts, shape_key(p));
}

Status sort_tokens_workspace_size(const SortTokensParams& p, const RunOptions& opts, size_t* bytes) {
  *bytes = 0;
  MOEKIT_RETURN_IF_ERROR(validate_sort_tokens(p));
  return dispatch_workspace_size(OpKind::sort_tokens, MoeVariant::none, &p, opts, shape_key(p), bytes);
}

}  // namespace moekit
