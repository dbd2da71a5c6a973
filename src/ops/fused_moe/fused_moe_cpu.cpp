// Shared stages of the CPU fused_moe kernels (src/ops/fused_moe/fused_moe_cpu.h).
#include "ops/fused_moe/fused_moe_cpu.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "cpu/thread_pool.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu::moe {

Status require_host(const FusedMoeParams& p) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2},
                                {"topk_ids", &p.topk_ids}, {"topk_weights", &p.topk_weights}, {"out", &p.out},
                                {"w1_scale", &p.w1_scale}, {"w2_scale", &p.w2_scale}, {"a1_scale", &p.a1_scale},
                                {"expert_mask", &p.expert_mask}, {"expert_map", &p.expert_map}}) {
    if (t->present() && t->device != Device::cpu) {
      return Unsupported("CPU kernels need host tensors; ", name, " is on ", device_name(t->device));
    }
  }
  return Status::Ok();
}

size_t expert_groups_bytes(const MoeDims& d) {
  const size_t slots = size_t(d.T * d.k);
  return align64(size_t(d.Eg) * 4) + align64(size_t(d.E + 1) * 4) + align64(slots * 4) + align64(size_t(d.E) * 4) +
         align64(slots);
}

void carve_expert_groups(const MoeDims& d, Carver& c, ExpertGroups* g) {
  const size_t slots = size_t(d.T * d.k);
  g->local = c.take<int32_t>(size_t(d.Eg));
  g->offset = c.take<int32_t>(size_t(d.E + 1));
  g->entry = c.take<int32_t>(slots);
  g->active = c.take<int32_t>(size_t(d.E));
  g->valid = c.take<uint8_t>(slots);
  g->n_active = 0;
}

void group_entries(const FusedMoeParams& p, const MoeDims& d, ExpertGroups* g) {
  ref::moe::build_local_table(p, g->local);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const int64_t slots = d.T * d.k;
  std::fill(g->offset, g->offset + d.E + 1, 0);
  for (int64_t q = 0; q < slots; ++q) {
    const int32_t e = ref::moe::local_expert(g->local, ids[q]);
    g->valid[q] = e >= 0;
    if (e >= 0) ++g->offset[e + 1];
  }
  for (int64_t e = 0; e < d.E; ++e) g->offset[e + 1] += g->offset[e];
  std::vector<int32_t> cursor(g->offset, g->offset + d.E);
  for (int64_t q = 0; q < slots; ++q) {
    const int32_t e = ref::moe::local_expert(g->local, ids[q]);
    if (e >= 0) g->entry[cursor[size_t(e)]++] = int32_t(q);
  }
  g->n_active = 0;
  for (int64_t e = 0; e < d.E; ++e) {
    if (g->offset[e + 1] > g->offset[e]) g->active[g->n_active++] = int32_t(e);
  }
}

void combine_slots(const FusedMoeParams& p, const MoeDims& d, const ExpertGroups& g, const float* y_slots) {
  const float* tw = p.topk_weights.ptr<const float>();
  parallel_for(d.T, [&](int64_t b, int64_t e) {
    std::vector<float> y(static_cast<size_t>(d.H));
    for (int64_t t = b; t < e; ++t) {
      std::fill(y.begin(), y.end(), 0.0f);
      for (int64_t j = 0; j < d.k; ++j) {
        const int64_t slot = t * d.k + j;
        if (!g.valid[slot]) continue;
        const float w = ref::moe::slot_weight(p, tw[slot]).out;
        const float* ys = y_slots + slot * d.H;
        for (int64_t h = 0; h < d.H; ++h) y[size_t(h)] += w * ys[h];
      }
      ref::moe::store_out_row(p.out, t, y.data());
    }
  });
}

Status require_avx512(const char* kernel, const CpuFeatures& f, bool need_bf16) {
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.os_saves_zmm)) {
    return Unsupported(kernel, ": CPU lacks AVX-512 F/BW/VL (has: ", describe(f), ")");
  }
  if (need_bf16 && !f.avx512bf16) return Unsupported(kernel, ": CPU lacks AVX-512 BF16 (has: ", describe(f), ")");
  return Status::Ok();
}

}  // namespace moekit::cpu::moe
