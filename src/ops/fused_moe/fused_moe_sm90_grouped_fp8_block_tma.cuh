// The TMA + wgmma gemms of fused_moe_sm90_grouped_fp8_block (steps 3 and 5 of its .cu's header):
// the fp8 ring of fused_moe_sm90_grouped_fp8_ring.cuh (Fp8Ring<kBM, kN>: 128 x 128 tiles, 64 x 256
// for fused_moe_sm90_grouped_fp8_block_tma64, 128 x 256 for fused_moe_sm90_grouped_fp8_block_n256)
// with a block-scaled consumer (wgmma m64n128k32 partial sums per 128-wide K slice, promoted into f32
// accumulators times the slice's activation and weight scales).
// Included by fused_moe_sm90_grouped_fp8_block.cu inside its anonymous namespace (uses its kBlk and
// BlkArgs).
// Tests: tests/test_fused_moe_sm90_grouped_fp8_block.cpp (suite FusedMoeSm90GroupedFp8Block).
#pragma once

// Scales a consumer thread applies per K slice kt: its two rows' activation scales (nullptr: a
// padding row past the rows, treated as 0) and the weight scales of its warpgroup's low (columns
// 0..63) and high (64..127) quarters of each 128-column half (lo1 / hi1: the second half of a
// 128 x 256 tile); each row of KT values.
struct BlkScales {
  const float* row0;
  const float* row1;
  const float* lo;
  const float* hi;
  const float* lo1 = nullptr;
  const float* hi1 = nullptr;
};

// Consumer warpgroup wg: acc (its 64 rows and 128 columns of the tile, Fp8Ring) = sum over K slices
// of the slice's wgmma partial sums times a_scale * w_scale (fp8_ring_consume_promoted).
template <int kBM>
__device__ __forceinline__ void blk_consume_tile(const typename Fp8Ring<kBM>::Smem& sm, typename Fp8Ring<kBM>::Ring& ring,
                                                 int wg, int KT, const BlkScales& sc, float (&acc)[16][4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
  // Slice kt's scales. NOTE: loaded a slice ahead (slice kt + 2's right after slice kt's promotion,
  // kept in registers until slice kt + 2 is promoted), so two groups' time covers their latency: the
  // waits are memory barriers to the compiler, and loads placed just before them (one group's cover)
  // left the consumers stalled on global loads (docs/experiments.md E68).
  struct Sc {
    float s0, s1, lo, hi;
  };
  auto scales = [&](int kt) {
    return Sc{sc.row0 != nullptr ? sc.row0[kt] : 0.0f, sc.row1 != nullptr ? sc.row1[kt] : 0.0f, sc.lo[kt], sc.hi[kt]};
  };
  Sc f[2] = {scales(0), scales(KT > 1 ? 1 : 0)};  // the scales of each buffer's next slice
  fp8_ring_consume_promoted<kBM>(sm, ring, wg, KT, [&](const float(&cur)[16][4], auto buf, int kt) {
    const Sc& fb = f[decltype(buf)::value];
    const float s0 = fb.s0, s1 = fb.s1, lo = fb.lo, hi = fb.hi;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float c = j < 8 ? lo : hi;
      const float f0 = s0 * c, f1 = s1 * c;
      acc[j][0] += cur[j][0] * f0;
      acc[j][1] += cur[j][1] * f0;
      acc[j][2] += cur[j][2] * f1;
      acc[j][3] += cur[j][3] * f1;
    }
    if (kt + 2 < KT) f[decltype(buf)::value] = scales(kt + 2);
  });
}

// Consumer warpgroup wg of a 128 x 256 tile (Fp8Ring<128, 256>): acc[h] (its 64 rows and the
// columns 128 h .. 128 h + 127) = sum over K slices of the half's wgmma partial sums times a_scale *
// w_scale (fp8_ring_consume_halves). The scales of slice kt + 2 are loaded while slice kt's second
// group runs and used two slices later. NOTE: loaded after slice kt's second fold, ptxas moved the
// weight scales into uniform registers right after their loads, so every slice waited there for a
// load before issuing the next group (E113).
template <int kBM, int kN>
__device__ __forceinline__ void blk_consume_tile_halves(const typename Fp8Ring<kBM, kN>::Smem& sm,
                                                        typename Fp8Ring<kBM, kN>::Ring& ring, int wg, int KT,
                                                        const BlkScales& sc, float (&acc)[2][16][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[h][j][q] = 0.0f;
  struct Sc {
    float s0, s1, lo0, hi0, lo1, hi1;
  };
  auto scales = [&](int kt) {
    return Sc{sc.row0 != nullptr ? sc.row0[kt] : 0.0f, sc.row1 != nullptr ? sc.row1[kt] : 0.0f,
              sc.lo[kt], sc.hi[kt], sc.lo1[kt], sc.hi1[kt]};
  };
  Sc cur = scales(0), nxt = scales(KT > 1 ? 1 : 0), far = nxt;
  fp8_ring_consume_halves<kBM, kN>(
      sm, ring, wg, KT,
      [&](const float(&t)[16][4], auto half, int) {
        constexpr int h = decltype(half)::value;
        const float lo = h == 0 ? cur.lo0 : cur.lo1, hi = h == 0 ? cur.hi0 : cur.hi1;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float c = j < 8 ? lo : hi;
          const float f0 = cur.s0 * c, f1 = cur.s1 * c;
          acc[h][j][0] += t[j][0] * f0;
          acc[h][j][1] += t[j][1] * f0;
          acc[h][j][2] += t[j][2] * f1;
          acc[h][j][3] += t[j][3] * f1;
        }
        if constexpr (h == 1) {
          cur = nxt;
          nxt = far;
        }
      },
      [&](int kt) {
        if (kt + 2 < KT) far = scales(kt + 2);
      });
}

// The schedule of fp8_ring_run with the block-scaled consumer, each tile in `splits` K ranges
// (split_tile): boxes(m, n, row0, b_rows) -> the A first row and the kBoxes B box rows,
// wblocks(m, n, wg, half, lo_block, hi_block) -> warpgroup wg's weight scale rows for the tile's
// 128-column half (0, and 1 for 128 x 256 tiles), epi(m, n, sp, wg, acc) with sp the K range and
// acc float[16][4], or float[2][16][4] (both halves) for 128 x 256 tiles.
template <int kBM, int kN, class Boxes, class WBlocks, class Epi>
__device__ __forceinline__ void blk_run(const typename Fp8Ring<kBM, kN>::Smem& sm, const CUtensorMap* ma,
                                        const CUtensorMap* mb, const BlkArgs& p, int n_tiles, int K, int N, int splits,
                                        Boxes boxes, WBlocks wblocks, Epi epi) {
  using C = Fp8Ring<kBM, kN>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KT = K / kBlk, NB = N / kBlk;
  fp8_ring_run<kBM, kN>(sm, ma, mb, *p.num_tiles, n_tiles, KT, splits, boxes,
                        [&](const SplitTile& w, int wg, typename C::Ring& ring) {
                          int blo, bhi;
                          wblocks(w.m, w.n, wg, 0, blo, bhi);
                          const int e = p.tile_expert[w.m], r0 = p.tile_row0[w.m] + C::row_of(warp, lane);
                          const float* ws = p.w_scale + int64_t(e) * NB * KT + w.kt0;  // the range's slices
                          BlkScales sc{r0 < p.tk ? p.a_scale + int64_t(r0) * KT + w.kt0 : nullptr,
                                       r0 + 8 < p.tk ? p.a_scale + int64_t(r0 + 8) * KT + w.kt0 : nullptr,
                                       ws + int64_t(blo) * KT, ws + int64_t(bhi) * KT};
                          if constexpr (C::kHalves) {
                            wblocks(w.m, w.n, wg, 1, blo, bhi);
                            sc.lo1 = ws + int64_t(blo) * KT;
                            sc.hi1 = ws + int64_t(bhi) * KT;
                            float acc[2][16][4];
                            blk_consume_tile_halves<kBM, kN>(sm, ring, wg, w.kn, sc, acc);
                            epi(w.m, w.n, w.sp, wg, acc);  // both halves
                          } else {
                            float acc[16][4];
                            blk_consume_tile<kBM>(sm, ring, wg, w.kn, sc, acc);
                            epi(w.m, w.n, w.sp, wg, acc);
                          }
                        });
}

// In place over the chunks j < kJ of a consumer thread's row h (accumulator columns 2 h, 2 h + 1):
// a = act(w g) * (w u) (G1U1: u in chunk j + 8) or act(w g), the products by w only when weighted
// (w = 1 is exact: two FMULs a value saved, E118); returns the maximum of amax and the row's |a|.
template <bool G1U1, Activation A, int kJ, bool kWeighted>
__device__ __forceinline__ float blk_act_amax(float (&acc)[16][4], int h, float w, float amax) {
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float& v = acc[j][2 * h + c];
      const float g = kWeighted ? v * w : v;
      if constexpr (G1U1) {
        const float u = acc[j + 8][2 * h + c];
        v = act<A>(g) * (kWeighted ? u * w : u);
      } else {
        v = act<A>(g);
      }
      amax = fmaxf(amax, fabsf(v));
    }
  return amax;
}
template <bool G1U1, Activation A, int kJ>
__device__ __forceinline__ float blk_act_amax(float (&acc)[16][4], int h, bool weighted, float w, float amax) {
  return weighted ? blk_act_amax<G1U1, A, kJ, true>(acc, h, w, amax) : blk_act_amax<G1U1, A, kJ, false>(acc, h, w, amax);
}

// The e4m3fn codes of row h's chunks j < kJ divided by s (ri = RN(1 / s)): two bytes per chunk at
// qrow + 8 j, by fp8_quotient_finite and the hardware convert. A row with an inf or NaN a gets other
// codes than the reference's (NaN where it has 0, another NaN sign) and the same all-NaN out row;
// the checked encode2_e4m3fn cost ~20% of the epilogue's instructions (E118).
template <int kJ>
__device__ __forceinline__ void blk_store_codes(uint8_t* qrow, const float (&acc)[16][4], int h, float s, float ri) {
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    *reinterpret_cast<uint16_t*>(qrow + 8 * j) = uint16_t(e4m3fn_quotient_codes2(acc[j][2 * h], acc[j][2 * h + 1], s, ri));
  }
}

// gemm1's epilogue on 128 x 256 tiles (consumer warpgroup of the tile's rows r0 and r0 + 8 within
// each 16-row slab; acc: both 128-column halves): a = act(g) * u (g1u1: 128 columns of a, one
// 128-group) or act(h) (g1u0: 256 columns, a group per half), computed in place, then re-quantized
// per (row, 128-group) as quant_groups_kernel does from the f32 a (the same amax over the group,
// s = max(amax, kFp8AmaxFloor) / 448, the codes of a / s through fp8_quotient) into p.aq and p.sa:
// the f32 a and the quantizer kernel between the gemms are skipped. A row's group lies in the four
// lanes of one quad (lane & 3); padding rows (past the expert's rows) take part in the shuffles, not
// the stores.
template <bool G1U1, Activation A>
__device__ __forceinline__ void blk_quant_a_epilogue(const BlkArgs& p, int m, int n, int r0, int lane,
                                                     float (&acc)[2][16][4]) {
  constexpr int kJ = G1U1 ? 8 : 16;          // a chunks (8 columns) of a half
  constexpr int kHalfCols = G1U1 ? 64 : 128;  // a columns of a half
  constexpr int kGroups = G1U1 ? 1 : 2;       // 128-groups of the tile
  const int e = p.tile_expert[m], row0 = p.tile_row0[m];
  const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3), G = p.I / kBlk;
  const bool weighted = p.weight_on_input;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rl = r0 + 8 * h, row = row0 + rl;
    const bool real = rl < nrows;
    const float w = weighted && real ? p.weights[p.row_entry[row]] : 1.0f;
    float amax[kGroups];  // g1u1: one group over both halves; g1u0: a group per half
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) amax[gi] = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float& m = amax[G1U1 ? 0 : half];
      m = blk_act_amax<G1U1, A, kJ>(acc[half], h, weighted, w, m);
    }
    float sc[kGroups], rinv[kGroups];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      amax[gi] = fmaxf(amax[gi], __shfl_xor_sync(0xffffffffu, amax[gi], 1));
      amax[gi] = fmaxf(amax[gi], __shfl_xor_sync(0xffffffffu, amax[gi], 2));
      sc[gi] = e4m3fn_scale_of(amax[gi]);
      rinv[gi] = __frcp_rn(sc[gi]);
    }
    if (!real) continue;
    uint8_t* qrow = p.aq + int64_t(row) * p.I + int64_t(n) * kGroups * kBlk + c0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      blk_store_codes<kJ>(qrow + half * kHalfCols, acc[half], h, sc[G1U1 ? 0 : half], rinv[G1U1 ? 0 : half]);
    }
    if ((lane & 3) == 0) {
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) p.sa[int64_t(row) * G + n * kGroups + gi] = sc[gi];
    }
  }
}

// Shared memory of the 64 x 256 gemm1 beyond its ring: each warpgroup's per-row amax of a (64 rows).
constexpr int kBlkXchBytes = 2 * 64 * 4;

// gemm1's epilogue on 64 x 256 tiles (consumer warpgroup wg: the tile's 64 rows, rows r0 and r0 + 8
// of each 16-row slab, and its 128 of the 256 columns): a = act(g) * u (g1u1: warpgroup wg holds a
// columns 64 wg .. 64 wg + 63 of the tile's one 128-group) or act(h) (g1u0: its own 128-group),
// computed in place and re-quantized per (row, 128-group) as blk_quant_a_epilogue does. g1u1: the
// two warpgroups' row amaxes meet in xch (kBlkXchBytes of shared memory) between two barriers of the
// consumer warpgroups, the second so the next tile's amaxes wait for these reads. Every consumer
// thread takes part in the shuffles and barriers; padding rows are not stored.
template <bool G1U1, Activation A>
__device__ __forceinline__ void blk_quant_a_epilogue_64(const BlkArgs& p, int m, int n, int wg, int r0, int lane,
                                                        float (&acc)[16][4], float* xch) {
  constexpr int kJ = G1U1 ? 8 : 16;  // a chunks (8 columns) of the warpgroup
  const int e = p.tile_expert[m], row0 = p.tile_row0[m];
  const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3), G = p.I / kBlk;
  float amax[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rl = r0 + 8 * h;
    const float w = p.weight_on_input && rl < nrows ? p.weights[p.row_entry[row0 + rl]] : 1.0f;
    amax[h] = blk_act_amax<G1U1, A, kJ>(acc, h, p.weight_on_input, w, 0.0f);
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
  }
  if constexpr (G1U1) {
    if ((lane & 3) == 0) {
      xch[wg * 64 + r0] = amax[0];
      xch[wg * 64 + r0 + 8] = amax[1];
    }
    ws_consumers_sync();
    amax[0] = fmaxf(amax[0], xch[(1 - wg) * 64 + r0]);
    amax[1] = fmaxf(amax[1], xch[(1 - wg) * 64 + r0 + 8]);
    ws_consumers_sync();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rl = r0 + 8 * h, row = row0 + rl;
    if (rl >= nrows) continue;
    const float s = e4m3fn_scale_of(amax[h]), ri = __frcp_rn(s);
    const int col = G1U1 ? n * kBlk + wg * 64 : (2 * n + wg) * kBlk;  // the warpgroup's first a column
    blk_store_codes<kJ>(p.aq + int64_t(row) * p.I + col + c0, acc, h, s, ri);
    if ((lane & 3) == 0 && (!G1U1 || wg == 0)) p.sa[int64_t(row) * G + col / kBlk] = s;
  }
}

// gemm1: ma = xq [Tk, H] (boxes of kBM rows), mb = w1 as [E * N1, H] (boxes of 64 rows). The N tile
// holds nb gate columns from i0 = nb n (g1u1: and the matching up columns): 128 x 128: g1u1 64 + 64,
// g1u0 128; 64 x 256: g1u1 128 + 128 (warpgroup wg: gate and up columns i0 + 64 wg ..), g1u0 256
// (warpgroup wg: i0 + 128 wg ..); 128 x 256: g1u1 128 + 128 (half h: gate and up columns i0 + 64 h ..),
// g1u0 256 (half h: i0 + 128 h ..).
template <bool G1U1, Activation A, int kBM, int kN = kFp8RingN<kBM>>
__global__ void __launch_bounds__(kFp8RingThreads, 1)
    gemm1_blk_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, BlkArgs p,
                     int n_tiles) {
  using C = Fp8Ring<kBM, kN>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename C::Smem sm = ws_setup<typename C::Smem>(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n1 = G1U1 ? 2 * p.I : p.I;
  constexpr int nb = G1U1 ? C::kNCols / 2 : C::kNCols;  // gate columns of a tile
  constexpr int wg_cols = kBM == 128 ? 0 : nb / 2;      // gate columns between the warpgroups
  constexpr int half_cols = C::kHalves ? nb / 2 : 0;     // gate columns between the halves
  blk_run<kBM, kN>(
      sm, &ma, &mb, p, n_tiles, p.H, n1, 1,
      [&](int m, int n, int& row0, int (&b)[C::kBoxes]) {
        row0 = p.tile_row0[m];
        fp8_gemm1_box_rows<C::kBoxes, G1U1>(p.tile_expert[m], n1, p.I, n * nb, b);
      },
      [&](int, int n, int wg, int half, int& lo, int& hi) {
        const int c0 = n * nb + wg * wg_cols + half * half_cols;
        lo = c0 / kBlk;
        hi = G1U1 ? (p.I + c0) / kBlk : lo;
      },
      [&](int m, int n, int, int wg, auto& acc) {
        if constexpr (C::kHalves) {
          blk_quant_a_epilogue<G1U1, A>(p, m, n, C::row_of(warp, lane), lane, acc);
        } else if constexpr (kBM == 64) {
          blk_quant_a_epilogue_64<G1U1, A>(p, m, n, wg, C::row_of(warp, lane), lane, acc,
                                           reinterpret_cast<float*>(ws_extra_smem_of<typename C::Smem>(smem_raw)));
        } else {
          const int e = p.tile_expert[m], row0 = p.tile_row0[m], i0 = n * nb + wg * wg_cols;
          const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int rl = C::row_of(warp, lane) + 8 * h;
            if (rl >= nrows) continue;
            const int row = row0 + rl;
            const float w = p.weight_on_input ? p.weights[p.row_entry[row]] : 1.0f;
            float* orow = p.out + int64_t(row) * p.I + i0 + c0;
            if constexpr (G1U1) {
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const float g0 = acc[j][2 * h] * w, g1 = acc[j][2 * h + 1] * w;
                const float u0 = acc[j + 8][2 * h] * w, u1 = acc[j + 8][2 * h + 1] * w;
                *reinterpret_cast<float2*>(orow + 8 * j) = make_float2(act<A>(g0) * u0, act<A>(g1) * u1);
              }
            } else {
#pragma unroll
              for (int j = 0; j < 16; ++j) {
                *reinterpret_cast<float2*>(orow + 8 * j) =
                    make_float2(act<A>(acc[j][2 * h] * w), act<A>(acc[j][2 * h + 1] * w));
              }
            }
          }
        }
      });
}

// gemm2's y stores by TMA (sm90::tma_store_f32_rows) where the ring leaves room for two staging
// buffers a warpgroup: 128 x 256 tiles (4 stages of 48 KiB) in 32-column chunks, 64 x 256 tiles (5
// of 40 KiB) in 16-column chunks; the 128 x 128 tiles' 7 stages leave none.
template <int kBM, int kN>
constexpr bool kBlkYByTma = Fp8Ring<kBM, kN>::kHalves || kBM == 64;
template <int kBM, int kN>
constexpr int kBlkYChunkCols = Fp8Ring<kBM, kN>::kHalves ? 32 : 16;
// The shared memory beyond the ring (stages and barriers): both consumer warpgroups' buffers.
template <int kBM, int kN>
constexpr int kBlkYStoreBytes =
    kBlkYByTma<kBM, kN> ? sm90::tma_store_f32_extra_smem<kBlkYChunkCols<kBM, kN>>(
                              Fp8Ring<kBM, kN>::kStages * int(Fp8Ring<kBM, kN>::kStageBytes + 16), 0, 2)
                        : 0;
static_assert(Fp8Ring<128, 256>::kSmemBytes + kBlkYStoreBytes<128, 256> <= kSm90SmemOptinBytes, "fits one CTA");
static_assert(Fp8Ring<64, 256>::kSmemBytes + kBlkYStoreBytes<64, 256> <= kSm90SmemOptinBytes, "fits one CTA");

// gemm2: ma = aq [Tk, I] (boxes of kBM rows), mb = w2 as [E * H, I] (boxes of 64 rows): N tile = H
// rows [h0, h0 + kNCols); warpgroup wg: h0 + 128 wg .. for 64 x 256, half h: h0 + 128 h .. for
// 128 x 256. In p.splits K ranges, range sp writing its partial at p.out + sp * p.y_split.
// kBlkYByTma tiles: my = y as [splits * Tk, H] f32 (boxes of kBlkYChunkCols x 64,
// encode_tensor_map_2d): a warpgroup whose 64 rows are all the expert's stores them by TMA through
// kBlkYStoreBytes of shared memory, one with padding rows from registers.
// NOTE: from registers, the 128 KiB of a tile's f32 y bounded the down gemm at Qwen3-30B's K = 768
// (6 slices a tile): lg_throttle its top stall, the tensor pipe at 41% (E110, E124).
template <int kBM, int kN = kFp8RingN<kBM>>
__global__ void __launch_bounds__(kFp8RingThreads, 1)
    gemm2_blk_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     const __grid_constant__ CUtensorMap my, BlkArgs p, int n_tiles) {
  using C = Fp8Ring<kBM, kN>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename C::Smem sm = ws_setup<typename C::Smem>(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int wg_cols = kBM == 128 ? 0 : kBlk;
  constexpr int half_cols = C::kHalves ? kBlk : 0;
  constexpr int kChunk = kBlkYChunkCols<kBM, kN>;
  uint32_t ybuf = 0;  // this consumer warpgroup's staging buffers (kBlkYByTma tiles)
  if constexpr (kBlkYByTma<kBM, kN>) {
    ybuf = smem_addr(align_smem_1024(ws_extra_smem_of<typename C::Smem>(smem_raw))) +
           uint32_t(warpgroup_index() & 1) * sm90::kF32StoreBytesPerWarpgroup<kChunk>;
  }
  blk_run<kBM, kN>(
      sm, &ma, &mb, p, n_tiles, p.I, p.H, p.splits,
      [&](int m, int n, int& row0, int (&b)[C::kBoxes]) {
        row0 = p.tile_row0[m];
        fp8_gemm2_box_rows(p.tile_expert[m], p.H, n * C::kNCols, b);
      },
      [&](int, int n, int wg, int half, int& lo, int& hi) {
        lo = hi = (n * C::kNCols + wg * wg_cols + half * half_cols) / kBlk;
      },
      [&](int m, int n, int sp, int wg, auto& acc_all) {
        const int e = p.tile_expert[m], row0 = p.tile_row0[m];
        const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3);
        auto store = [&](int half, const float (&acc)[16][4]) {
          const int h0 = n * C::kNCols + wg * wg_cols + half * half_cols;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int rl = C::row_of(warp, lane) + 8 * h;
            if (rl >= nrows) continue;
            float* yrow = p.out + sp * p.y_split + int64_t(row0 + rl) * p.H + h0 + c0;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              *reinterpret_cast<float2*>(yrow + 8 * j) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
            }
          }
        };
        if constexpr (C::kHalves) {
          if (64 * wg + 64 <= nrows) {  // warpgroup-uniform
            const int row = sp * p.tk + row0 + 64 * wg;  // y_split = Tk H
            sm90::tma_store_f32_rows<16, kChunk>(&my, ybuf, wg, row, n * C::kNCols, acc_all[0]);
            sm90::tma_store_f32_rows<16, kChunk>(&my, ybuf, wg, row, n * C::kNCols + kBlk, acc_all[1]);
          } else {
            store(0, acc_all[0]);
            store(1, acc_all[1]);
          }
        } else if constexpr (kBlkYByTma<kBM, kN>) {  // 64 x 256: both warpgroups hold the 64 rows
          if (nrows >= 64) {
            sm90::tma_store_f32_rows<16, kChunk>(&my, ybuf, wg, sp * p.tk + row0, n * C::kNCols + wg * wg_cols,
                                                 acc_all);
          } else {
            store(0, acc_all);
          }
        } else {
          store(0, acc_all);
        }
      });
  if constexpr (kBlkYByTma<kBM, kN>) {
    if (warp < kWsConsumerWarps) sm90::tma_store_f32_drain();
  }
}
