// The 32-value GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against Q8-quantised activations, as
// llama.cpp computes them: x is quantised per 32 values to int8 with a scale, each block's dot is
// an exact int8 x (4/5/8-bit) integer dot (AVX-512 VNNI `vpdpbusd` where built with it, else
// AVX2 `vpmaddubsw` + `vpmaddwd`: the same integers), then scaled in fp32.
//
// Activations (`q8_quantize_rows`), per row m and block b of 32 values of x [M, K] fp32:
//   amax = max |x|, d8 = amax / 127, q8 = round-to-nearest-even(x * (127 / amax)) (0 where
//   amax = 0), si = sum(q8) (exact), s8 = d8 * si.
// A weight block is d * u + mn with unsigned codes u (Q4: 0..15, Q5: 0..31; mn = m for Q4_1/Q5_1,
// -8 d for Q4_0, -16 d for Q5_0) or, for Q8_0, d * q with signed q (mn = 0). Its dot with the x
// block is approximated by  d * d8 * sum(u * q8) + mn * s8.
//
// Batch invariance: one output y[m, n] is computed by the same operations in the same order
// whatever M, the tile of rows it shares a weight row with, or the build (AVX2 or AVX-512):
//   P_b     = the 8 int32 lanes of the block's integer dot (lane i: values 4i .. 4i + 3; exact)
//   A_even  = fma-chain over the even blocks b of  (cvt(P_b) * d8_b) * d_b   (8 fp32 lanes)
//   A_odd   = the same over the odd blocks  (each: a multiply, then an fma with d_b)
//   y       = hsum8(A_even + A_odd) + mins_dot(mn, s8)  (mins_dot: 8 lanes over the blocks)
// The AVX-512 build runs two blocks per 512-bit register: its low half is A_even, its high half
// A_odd, so the numbers are those of the AVX2 build. The kernel takes MC x rows per weight row
// (MC = 1 at batch 1): the tile only decides which rows share the unpacked weight block. The x
// side's scale multiplies first so that, per x row and block, it is one load (AVX-512: `d8x16`,
// the block pairs' scales spread over 16 lanes, built once per tile of x rows by `q8_spread`).
#pragma once
#include "linear_simd.h"

// Whether the type runs through this file (else gemv.h's fp32-activation kernels).
static inline bool is_q8_block(int q) {
  return q == Q8_0 || q == Q4_0 || q == Q4_1 || q == Q5_0 || q == Q5_1;
}

// The 16-row packed forms of q8pack.h: type id QPACK + the ggml type.
static constexpr int QPACK = 64;
static constexpr int64_t PACK_ROWS = 16;
static inline bool is_packed(int q) {
  return q == QPACK + Q4_0 || q == QPACK + Q4_1 || q == QPACK + Q8_0;
}

// Row m of x: q8 [K] int8, d8 / s8 [K / 32] (see the header).
static inline void q8_quantize_row(const float* x, int64_t K, int8_t* q8, float* d8, float* s8,
                                   int32_t* si) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));  // RNE
    // pack 32 int32 -> 32 int8 in element order (packs interleave 128-bit lanes: permute back)
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i b8 = _mm256_packs_epi16(w01, w23);
    b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)(q8 + b * 32), b8);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    si[b] = _mm_cvtsi128_si32(s4);
    d8[b] = amax / 127.0f;
    s8[b] = d8[b] * (float)si[b];
  }
}

// Bit 4 of the 32 elements of a Q5_0/Q5_1 block (bit j of qh for element j) as 0/16 bytes.
static inline void q5_high_bits(const uint8_t* qh4, __m128i& lo, __m128i& hi) {
  uint32_t qh;
  memcpy(&qh, qh4, 4);
  const __m128i sel = _mm_set_epi8((char)0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01,
                                   (char)0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01);
  // byte j of lo: qh byte j / 8 (elements 0..15), of hi: byte 2 + j / 8 (elements 16..31).
  const __m128i blo = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m128i bhi = _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m128i v = _mm_cvtsi32_si128((int)qh);
  const __m128i l = _mm_and_si128(_mm_shuffle_epi8(v, blo), sel);
  const __m128i h = _mm_and_si128(_mm_shuffle_epi8(v, bhi), sel);
  lo = _mm_and_si128(_mm_cmpeq_epi8(l, sel), _mm_set1_epi8(16));
  hi = _mm_and_si128(_mm_cmpeq_epi8(h, sel), _mm_set1_epi8(16));
}

static inline float f16_at(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return half_to_float(h);
}

// One weight block, unpacked once for all the x rows of a tile.
struct Q8Block {
  __m256i u;  // codes in element order: unsigned (Q8_0: |q|, its signs in `sgn`)
  __m256i sgn;
  float d, mn;
};

template <int Q>
static inline Q8Block q8_unpack(const uint8_t* blk) {
  Q8Block k;
  k.d = f16_at(blk);
  if (Q == Q8_0) {
    k.sgn = _mm256_loadu_si256((const __m256i*)(blk + 2));
    k.u = _mm256_sign_epi8(k.sgn, k.sgn);  // NOTE: |-128| = 0x80, read as the unsigned 128
    k.mn = 0.0f;
    return k;
  }
  const bool has_min = Q == Q4_1 || Q == Q5_1, five = Q == Q5_0 || Q == Q5_1;
  const uint8_t* qs = blk + (has_min ? 4 : 2) + (five ? 4 : 0);
  const __m128i b = _mm_loadu_si128((const __m128i*)qs);
  __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
  if (five) {
    __m128i hlo, hhi;
    q5_high_bits(blk + (has_min ? 4 : 2), hlo, hhi);
    lo = _mm_or_si128(lo, hlo);
    hi = _mm_or_si128(hi, hhi);
  }
  k.u = _mm256_set_m128i(hi, lo);
  k.mn = has_min ? f16_at(blk + 2) : (five ? -16.0f : -8.0f) * k.d;
  return k;
}

// The 8 int32 lanes of sum(u * q8) (lane i: elements 4i .. 4i + 3): u < 128 for Q4/Q5, so
// `vpmaddubsw`'s int16 pair sums cannot saturate; Q8_0 runs |q| x sign-adjusted q8 (<= 2 * 128 * 127).
template <int Q>
static inline __m256i q8_block_dot(const Q8Block& k, const int8_t* q8) {
  __m256i s = _mm256_loadu_si256((const __m256i*)q8);
  if (Q == Q8_0) s = _mm256_sign_epi8(s, k.sgn);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), k.u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(k.u, s), _mm256_set1_epi16(1));
#endif
}

// sum_b mn[b] * s8[b] as 8 fp32 lanes (the tail masked in), to be reduced by hsum8.
static inline __m256 q8_mins_acc(const float* mn, const float* s8, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(mn + b), _mm256_loadu_ps(s8 + b), acc);
  if (b < nb) {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nb - b)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(mn + b, mask), _mm256_maskload_ps(s8 + b, mask), acc);
  }
  return acc;
}

// Lane m of the result = hsum8(v[m]) for 8 vectors, bitwise: the same additions in the same
// pairings (lanes i + i + 4, then + 2, then + 1), run on 8 vectors at once by transposing.
static inline __m256 hsum8x8(const __m256* v) {
  __m256 s[4], t[2];
  for (int i = 0; i < 4; ++i)  // low half: v[2i]'s lanes i + (i + 4), high half: v[2i + 1]'s
    s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  for (int i = 0; i < 2; ++i)  // per half: [v0: 0+2, 1+3, v2: 0+2, 1+3] (and v1, v3 high)
    t[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44),
                         _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x88),  // [v0 v2 v4 v6 | v1 ...]
                                 _mm256_shuffle_ps(t[0], t[1], 0xDD));
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static constexpr int64_t Q8_MAX_BLOCKS = 4096;  // K <= 131072 values per row

// y[m * ldy] for m < MC = weight row `row` (nb blocks of type Q) against x rows m of the Q8 form
// (q8 stride K, d8 / s8 stride nb). Every y has its own accumulators (see the header).
// d8x16[(p * MC + m) * 16 + l] = d8 of x row m, block 2p + l / 8 (the AVX-512 loop's per-pair
// scale vector), for MC rows: a block pair's MC vectors side by side (fixed offsets in the loop).
static inline void q8_spread(const float* d8, int64_t nb, int MC, float* d8x16) {
  for (int64_t m = 0; m < MC; ++m)
    for (int64_t p = 0; p < nb / 2; ++p)
      for (int l = 0; l < 16; ++l) d8x16[(p * MC + m) * 16 + l] = d8[m * nb + 2 * p + l / 8];
}

template <int Q, int MC>
static void q8_row_multi(const uint8_t* row, const int8_t* q8, const float* d8, const float* s8,
                         const float* d8x16, int64_t K, int64_t nb, float* y, int64_t ldy) {
  constexpr int BB = Q == Q8_0 ? 34 : Q == Q4_0 ? 18 : Q == Q4_1 ? 20 : Q == Q5_0 ? 22 : 24;
  float mn[Q8_MAX_BLOCKS];
  int64_t b = 0;
#if VW == 16
  __m512 acc[MC];
  _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i pairs = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (; b + 2 <= nb; b += 2) {
    const Q8Block k0 = q8_unpack<Q>(row + b * BB), k1 = q8_unpack<Q>(row + (b + 1) * BB);
    mn[b] = k0.mn, mn[b + 1] = k1.mn;
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(k0.u), k1.u, 1);
    __m512i sgn = _mm512_setzero_si512();
    if (Q == Q8_0) sgn = _mm512_inserti64x4(_mm512_castsi256_si512(k0.sgn), k1.sgn, 1);
    const __m512 dw = _mm512_permutexvar_ps(
        pairs, _mm512_castps128_ps512(_mm_setr_ps(k0.d, k1.d, 0.0f, 0.0f)));
    const float* dxp = d8x16 + (b / 2) * MC * 16;
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
      const int8_t* qx = q8 + m * K + b * 32;
      __m512i s = _mm512_loadu_si512((const void*)qx);
      if (Q == Q8_0) {  // s * sign(w): negate where w < 0, zero where w == 0
        s = _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(sgn), _mm512_setzero_si512(), s);
        s = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(sgn, sgn), s);
      }
#if defined(__AVX512VNNI__)
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
      const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
      const __m512 dx = _mm512_loadu_ps(dxp + m * 16);
      acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p), dx), dw, acc[m]);
    }
  }
  __m256 ae[MC], ao[MC];
  _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
    ae[m] = _mm512_castps512_ps256(acc[m]);
    ao[m] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[m]), 1));
  }
#else
  __m256 ae[MC], ao[MC];
  _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) ae[m] = ao[m] = _mm256_setzero_ps();
  for (; b + 2 <= nb; b += 2) {
    const Q8Block k0 = q8_unpack<Q>(row + b * BB), k1 = q8_unpack<Q>(row + (b + 1) * BB);
    mn[b] = k0.mn, mn[b + 1] = k1.mn;
    const __m256 dw0 = _mm256_set1_ps(k0.d), dw1 = _mm256_set1_ps(k1.d);
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
      const int8_t* qx = q8 + m * K + b * 32;
      const float* dx = d8 + m * nb + b;
      const __m256 t0 = _mm256_mul_ps(_mm256_cvtepi32_ps(q8_block_dot<Q>(k0, qx)),
                                      _mm256_broadcast_ss(dx));
      const __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(q8_block_dot<Q>(k1, qx + 32)),
                                      _mm256_broadcast_ss(dx + 1));
      ae[m] = _mm256_fmadd_ps(t0, dw0, ae[m]);
      ao[m] = _mm256_fmadd_ps(t1, dw1, ao[m]);
    }
  }
#endif
  if (b < nb) {  // an odd block count: the last (even) block
    const Q8Block k0 = q8_unpack<Q>(row + b * BB);
    mn[b] = k0.mn;
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
      const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q8_block_dot<Q>(k0, q8 + m * K + b * 32)),
                                     _mm256_broadcast_ss(d8 + m * nb + b));
      ae[m] = _mm256_fmadd_ps(t, _mm256_set1_ps(k0.d), ae[m]);
    }
  }
  if constexpr (MC % 8 == 0) {  // NOTE: the numbers of the per-row branch below, 8 rows at once
    for (int m0 = 0; m0 < MC; m0 += 8) {
      __m256 v[8], w[8];
      _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) {
        v[i] = _mm256_add_ps(ae[m0 + i], ao[m0 + i]);
        w[i] = Q == Q8_0 ? _mm256_setzero_ps() : q8_mins_acc(mn, s8 + (m0 + i) * nb, nb);
      }
      alignas(32) float out[8];
      _mm256_store_ps(out, _mm256_add_ps(hsum8x8(v), hsum8x8(w)));
      for (int i = 0; i < 8; ++i) y[(m0 + i) * ldy] = out[i];
    }
  } else {
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
      const float mins = Q == Q8_0 ? 0.0f : hsum8(q8_mins_acc(mn, s8 + m * nb, nb));
      y[m * ldy] = hsum8(_mm256_add_ps(ae[m], ao[m])) + mins;
    }
  }
}
