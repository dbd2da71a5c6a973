// sort_tokens_avx512: the CPU backend's token sort (SPEC 2, contract moekit/ops/sorting.h), both
// encodings, expert_mask / expert_map / -1 ids.
//
// A counting sort with per-chunk histograms and prefix offsets (no atomics):
//   1. (threads) the tokens are cut into C contiguous chunks; each chunk counts its entries per
//      local expert into its own histogram row and records its first id outside [-1, Eg);
//   2. (caller) a bad id is reported (the smallest flat index, the reference's message) before
//      anything is written; else each expert's padded run start, and each chunk's first position
//      inside every run = run start + the counts of the chunks before it;
//   3. (threads) each chunk scatters its entries in (token, slot) order from its own offsets, so an
//      expert's entries end up in (token, slot) order whatever C is; each chunk also writes its
//      share of the padding (the tail of every run and the region past num_valid, 16-wide stores)
//      and of sorted_expert_ids.
// Every output element has exactly one writer and one value, so the result is bit-identical to
// sort_tokens_ref for any chunk count and thread schedule. C = the pool size from kParallelEntries
// entries up, else 1 (the call stays on the calling thread).
// Test: tests/test_sort_tokens.cpp (Cpu* cases) and every case of src/testing/check_sort_tokens.cpp
// (this kernel against sort_tokens_ref).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/sorting.h"
#include "ops/sort_tokens/sort_tokens_local.h"

namespace moekit::cpu {

void register_sort_tokens_avx512(Registry& r);

namespace {

// Entries (T * k) from which the passes run on the thread pool. NOTE: each pass is a few ns per
// entry and the two pool wake-ups cost tens of us on the 2-core development machine, so threads
// pay only on large inputs (docs/experiments.md E97).
constexpr int64_t kParallelEntries = int64_t(1) << 18;

Status supports(const SortTokensParams& p) {
  return require_host_tensors("sort_tokens_avx512", {{"topk_ids", &p.topk_ids},
                                                     {"topk_weights", &p.topk_weights},
                                                     {"expert_mask", &p.expert_mask},
                                                     {"expert_map", &p.expert_map},
                                                     {"sorted_token_ids", &p.sorted_token_ids},
                                                     {"sorted_weights", &p.sorted_weights},
                                                     {"sorted_expert_ids", &p.sorted_expert_ids},
                                                     {"num_valid", &p.num_valid},
                                                     {"error_count", &p.error_count}});
}

// out[i] = v for i in [b, e).
MOEKIT_CPU_AVX512 void fill_i32(int32_t* out, int64_t b, int64_t e, int32_t v) {
  const __m512i vv = _mm512_set1_epi32(v);
  for (int64_t i = b; i < e; i += 16) _mm512_mask_storeu_epi32(out + i, simd::tail_mask(e - i), vv);
}

// The sort's shared state: inputs, the chunking and the per-chunk tables.
struct Plan {
  int64_t T = 0, k = 0, E = 0, bm = 1, Eg = 0, chunks = 1;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  std::vector<int32_t> local;      // [Eg] local expert of each global one, -1 = not here
  std::vector<int64_t> count;      // [chunks, E] entries of each chunk per expert; pass 2 turns
                                   //   each into the chunk's first position in the expert's run
  std::vector<int64_t> first_bad;  // [chunks] flat index of the chunk's first bad id, or -1
  std::vector<int64_t> total;      // [E] entries per expert
  std::vector<int64_t> start;      // [E + 1] padded run starts; start[E] = num_valid
  int64_t token_begin(int64_t c) const { return T * c / chunks; }
};

// Pass 1 for chunk c: histogram row c, stopping at the chunk's first bad id.
// NOTE: the loops of passes 1 and 3 read the plan through locals: their int64 / int32 stores could
// otherwise alias the plan's fields and force a reload of every one of them per entry.
void count_chunk(Plan& pl, int64_t c) {
  int64_t* cnt = pl.count.data() + c * pl.E;
  const int32_t* ids = pl.ids;
  const int32_t* local = pl.local.data();
  const int64_t Eg = pl.Eg, end = pl.token_begin(c + 1) * pl.k;
  for (int64_t i = pl.token_begin(c) * pl.k; i < end; ++i) {
    const int32_t g = ids[i];
    if (g == -1) continue;
    if (g < 0 || g >= Eg) {
      pl.first_bad[size_t(c)] = i;
      return;
    }
    const int32_t e = local[g];
    if (e >= 0) ++cnt[e];
  }
}

// Scatters the entries of tokens [t0, t1) from the offsets `off` (advanced), in (token, slot) order.
template <bool kPacked>
void scatter(const int32_t* ids, const int32_t* w_bits, const int32_t* local, int64_t k, int64_t t0, int64_t t1,
             int64_t* off, int32_t* out_ids, int32_t* out_w) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = t * k + j;
      const int32_t g = ids[i];
      if (g == -1) continue;
      const int32_t e = local[g];
      if (e < 0) continue;
      const int64_t pos = off[e]++;
      out_ids[pos] = kPacked ? int32_t((j << 24) | t) : int32_t(i);
      out_w[pos] = w_bits[i];
    }
  }
}

// Pass 3 for chunk c: its entries, plus its share of the padding and of sorted_expert_ids.
MOEKIT_CPU_AVX512 void fill_chunk(const SortTokensParams& p, Plan& pl, int64_t c, int32_t pad) {
  int32_t* out_ids = p.sorted_token_ids.ptr<int32_t>();
  int32_t* out_w = p.sorted_weights.ptr<int32_t>();  // f32 bits; padding is +0.0f = bits 0
  int32_t* out_e = p.sorted_expert_ids.ptr<int32_t>();
  const auto* w_bits = reinterpret_cast<const int32_t*>(pl.weights);  // copied bit-exactly
  int64_t* off = pl.count.data() + c * pl.E;
  if (p.encoding == SortEncoding::packed) {
    scatter<true>(pl.ids, w_bits, pl.local.data(), pl.k, pl.token_begin(c), pl.token_begin(c + 1), off, out_ids, out_w);
  } else {
    scatter<false>(pl.ids, w_bits, pl.local.data(), pl.k, pl.token_begin(c), pl.token_begin(c + 1), off, out_ids, out_w);
  }
  for (int64_t e = pl.E * c / pl.chunks; e < pl.E * (c + 1) / pl.chunks; ++e) {
    const int64_t b = pl.start[size_t(e)], used = b + pl.total[size_t(e)], end = pl.start[size_t(e) + 1];
    fill_i32(out_ids, used, end, pad);
    fill_i32(out_w, used, end, 0);
    fill_i32(out_e, b / pl.bm, end / pl.bm, int32_t(e));
  }
  // Past num_valid: padding entries and unused blocks (-1), cut evenly over the chunks.
  const int64_t num_valid = pl.start[size_t(pl.E)];
  const int64_t tail = p.sorted_token_ids.shape[0] - num_valid;
  const int64_t t0 = num_valid + tail * c / pl.chunks, t1 = num_valid + tail * (c + 1) / pl.chunks;
  fill_i32(out_ids, t0, t1, pad);
  fill_i32(out_w, t0, t1, 0);
  const int64_t b0 = num_valid / pl.bm, blocks = p.sorted_expert_ids.shape[0] - b0;
  fill_i32(out_e, b0 + blocks * c / pl.chunks, b0 + blocks * (c + 1) / pl.chunks, -1);
}

// Runs fn(c) for every chunk, on the pool when there is more than one.
template <class F>
void for_chunks(int64_t chunks, const F& fn) {
  if (chunks == 1) {
    fn(0);
    return;
  }
  parallel_for(chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) fn(c);
  });
}

Status run(const SortTokensParams& p, const RunContext&) {
  Plan pl;
  pl.T = p.topk_ids.shape[0];
  pl.k = p.topk_ids.shape[1];
  pl.E = p.num_experts;
  pl.bm = p.block_m;
  pl.ids = p.topk_ids.ptr<const int32_t>();
  pl.weights = p.topk_weights.ptr<const float>();
  pl.local = sort_tokens_local_table(p);
  pl.Eg = int64_t(pl.local.size());
  for (size_t g = 0; g < pl.local.size(); ++g) {
    // NOTE: validate_sort_tokens() guarantees this; re-checked so a direct Kernel::run call on an
    // unvalidated map cannot index out of bounds.
    if (pl.local[g] >= pl.E) return Internal("sort_tokens_avx512: expert_map sends expert ", g, " to ", pl.local[g], " >= E=", pl.E);
  }
  pl.chunks = pl.T * pl.k >= kParallelEntries ? std::min<int64_t>(num_threads(), pl.T) : 1;
  pl.count.assign(static_cast<size_t>(pl.chunks * pl.E), 0);
  pl.first_bad.assign(static_cast<size_t>(pl.chunks), -1);

  // Pass 1: histograms; a bad id is reported before anything is written.
  for_chunks(pl.chunks, [&](int64_t c) { count_chunk(pl, c); });
  for (int64_t c = 0; c < pl.chunks; ++c) {
    const int64_t i = pl.first_bad[size_t(c)];
    if (i >= 0) {  // chunks are in flat order: the first chunk with a bad id holds the first one
      return InvalidArgument("topk_ids: token ", i / pl.k, " slot ", i % pl.k, " has expert id ", pl.ids[i],
                             ", outside [0, Eg=", pl.Eg, ") (-1 means no expert)");
    }
  }

  // Pass 2: run starts, then each chunk's offsets inside every run.
  pl.total.assign(static_cast<size_t>(pl.E), 0);
  pl.start.assign(static_cast<size_t>(pl.E) + 1, 0);
  for (int64_t e = 0; e < pl.E; ++e) {
    int64_t at = pl.start[size_t(e)];
    for (int64_t c = 0; c < pl.chunks; ++c) {
      int64_t& slot = pl.count[size_t(c * pl.E + e)];
      const int64_t n = slot;
      slot = at;
      at += n;
    }
    pl.total[size_t(e)] = at - pl.start[size_t(e)];
    pl.start[size_t(e) + 1] = pl.start[size_t(e)] + (pl.total[size_t(e)] + pl.bm - 1) / pl.bm * pl.bm;
  }
  const int64_t num_valid = pl.start[size_t(pl.E)];
  if (num_valid > p.sorted_token_ids.shape[0]) {
    return Internal("sort_tokens_avx512: padded length ", num_valid, " exceeds max_padded ",
                    p.sorted_token_ids.shape[0]);
  }

  // Pass 3: entries, padding and block owners.
  const int32_t pad = p.encoding == SortEncoding::packed ? int32_t((pl.k << 24) | pl.T) : int32_t(pl.T * pl.k);
  for_chunks(pl.chunks, [&](int64_t c) { fill_chunk(p, pl, c, pad); });
  p.num_valid.ptr<int32_t>()[0] = int32_t(num_valid);
  if (p.error_count.present()) p.error_count.ptr<int32_t>()[0] = 0;  // bad ids were rejected in pass 1
  return Status::Ok();
}

}  // namespace

void register_sort_tokens_avx512(Registry& r) {
  r.add({"sort_tokens_avx512", OpKind::sort_tokens, MoeVariant::none, Backend::cpu,
         "topk_ids i32, topk_weights f32 -> i32 ids (packed|flat), f32 weights copied; threaded counting sort", 50,
         erase_supports<SortTokensParams, supports>, nullptr, erase_run<SortTokensParams, run>});
}

}  // namespace moekit::cpu
