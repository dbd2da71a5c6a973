// The global -> local expert table of sort_tokens (SPEC 2) on the host, shared by the reference and
// the AVX-512 kernel (the CUDA kernel builds the same table on the device, local_table_kernel).
// Header-only. Tests: tests/test_sort_tokens.cpp, tests/test_sort_tokens_avx512.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ops/sorting.h"

namespace moekit {

// local[g] = local expert of global expert g, or -1 when it is not held here: with an expert_mask
// the running count of kept experts, with an expert_map the map itself, else the identity.
inline std::vector<int32_t> sort_tokens_local_table(const SortTokensParams& p) {
  if (p.expert_mask.present()) {
    const int32_t* mask = p.expert_mask.ptr<const int32_t>();
    std::vector<int32_t> local(static_cast<size_t>(p.expert_mask.shape[0]));
    int32_t cumsum = 0;
    for (size_t g = 0; g < local.size(); ++g) {
      cumsum += mask[g];
      local[g] = mask[g] ? cumsum - 1 : -1;
    }
    return local;
  }
  if (p.expert_map.present()) {
    const int32_t* map = p.expert_map.ptr<const int32_t>();
    return std::vector<int32_t>(map, map + p.expert_map.shape[0]);
  }
  std::vector<int32_t> local(static_cast<size_t>(p.num_experts));
  for (size_t g = 0; g < local.size(); ++g) local[g] = int32_t(g);
  return local;
}

}  // namespace moekit
