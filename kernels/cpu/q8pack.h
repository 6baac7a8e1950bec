// Q4_0, Q4_1 and Q8_0 weights repacked at load time in groups of 16 rows, for the block kernels
// on Q8 activations (the activations as in q8dot.h). One 16-bit or 32-bit lane per weight row: a
// block's integer dot lands whole in its row's lane, so nothing is reduced across lanes and every
// weight byte is unpacked by a shift and a mask.
//
// Layout (kernels/cpu/linear.py `pack_blocks`): rows [16 g, 16 g + 16) of N (a multiple of 16) form
// group g; a group holds its K / 32 blocks in order, each 16 x the GGUF block's bytes:
//   f16 d[16]  (one per row)  |  Q4_1: f16 m[16]  |  codes
//   codes, Q4_0 / Q4_1: 4 chunks of 64 bytes; chunk c, bytes 4 r .. 4 r + 3 = row r's
//     qs[4 c .. 4 c + 3]
//     (low nibbles: elements 4 c .. 4 c + 3, high nibbles: elements 16 + 4 c .. 16 + 4 c + 3);
//   codes, Q8_0: 8 chunks of 64 bytes; chunk t, bytes 4 r .. 4 r + 3 = row r's q[4 t .. 4 t + 3].
// A 64-byte chunk is one 512-bit register of 16 rows x 4 codes (AVX2: two of 8 rows); `vpdpbusd`
// (or `vpmaddubsw` + `vpmaddwd`) against the 4 x bytes broadcast adds each row's 4 products.
//
// Per output y[m, n] (lane n of its group), over the blocks b in order, every build:
//   P_b = the exact integer sum(u * q8) of block b (Q4: unsigned codes u; Q8_0: signed q)
//   acc = fma(cvt(P_b) * d8_b, d_b, acc);  Q4_0 / Q4_1: acc = fma(mn_b, s8_b, acc)
// with mn = m (Q4_1) or -8 d (Q4_0). P_b is exact however its partial sums are split, so the
// AVX2 and AVX-512 builds and every tile of x rows give the same bits (batch invariance).
#pragma once
#include "q8dot.h"

#if VW == 16
typedef __m512i vi;
static inline vi vi_load(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
static inline vi vi_zero() { return _mm512_setzero_si512(); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vi vi_set1(int32_t v) { return _mm512_set1_epi32(v); }
static inline vi vi_lo4(vi a) { return _mm512_and_si512(a, _mm512_set1_epi8(0x0F)); }
static inline vi vi_hi4(vi a) {
  return _mm512_and_si512(_mm512_srli_epi16(a, 4), _mm512_set1_epi8(0x0F));
}
static inline vf vi_cvt(vi a) { return _mm512_cvtepi32_ps(a); }
// p + per int32 lane the 4 products of unsigned u and signed s.
static inline vi vi_dot(vi p, vi u, vi s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(p, u, s);
#else
  return vi_add(p, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
// p + the products of signed q and s, as |q| x (s with q's sign): |-128| reads as unsigned 128.
static inline vi vi_sdot(vi p, vi q, vi s) {
  s = _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(q), _mm512_setzero_si512(), s);
  s = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(q, q), s);
  return vi_dot(p, _mm512_abs_epi8(q), s);
}
#else
typedef __m256i vi;
static inline vi vi_load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline vi vi_zero() { return _mm256_setzero_si256(); }
static inline vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
static inline vi vi_set1(int32_t v) { return _mm256_set1_epi32(v); }
static inline vi vi_lo4(vi a) { return _mm256_and_si256(a, _mm256_set1_epi8(0x0F)); }
static inline vi vi_hi4(vi a) {
  return _mm256_and_si256(_mm256_srli_epi16(a, 4), _mm256_set1_epi8(0x0F));
}
static inline vf vi_cvt(vi a) { return _mm256_cvtepi32_ps(a); }
static inline vi vi_dot(vi p, vi u, vi s) {
  return vi_add(p, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
static inline vi vi_sdot(vi p, vi q, vi s) {
  return vi_dot(p, _mm256_abs_epi8(q), _mm256_sign_epi8(s, q));
}
#endif

// Without VNNI a Q4 block's 8 `vpmaddubsw` pair sums add up in 16-bit lanes before one `vpmaddwd`:
// a pair sum is at most 2 * 15 * 127 = 3810 in magnitude (codes <= 15, |q8| <= 127), 8 of them
// 30480 < 2^15, so P_b is the same exact integer for 8 fewer widening multiplies per x row.
#if defined(__AVX512VNNI__) && VW == 16
static constexpr bool DOT16 = false;
#else
static constexpr bool DOT16 = true;
#endif
#if VW == 16
static inline vi vi_dot16(vi a, vi u, vi s) {
  return _mm512_add_epi16(a, _mm512_maddubs_epi16(u, s));
}
static inline vi vi_add16(vi a, vi b) { return _mm512_add_epi16(a, b); }
static inline vi vi_widen16(vi a) { return _mm512_madd_epi16(a, _mm512_set1_epi16(1)); }
#else
static inline vi vi_dot16(vi a, vi u, vi s) {
  return _mm256_add_epi16(a, _mm256_maddubs_epi16(u, s));
}
static inline vi vi_add16(vi a, vi b) { return _mm256_add_epi16(a, b); }
static inline vi vi_widen16(vi a) { return _mm256_madd_epi16(a, _mm256_set1_epi16(1)); }
#endif

#if defined(__AVX512VNNI__) && VW == 16
// NOTE: Q8_0 runs as unsigned q + 128 (one `vpdpbusd` a step), then P -= 128 sum(q8) of the block.
static constexpr bool Q8_XOR = true;
static inline vi vi_bias128(vi a) { return _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80)); }
#else
static constexpr bool Q8_XOR = false;
static inline vi vi_bias128(vi a) { return a; }
#endif

// Bytes of one block of one row (a packed block of a group is 16 of them).
template <int Q>
static constexpr int64_t q8p_block_bytes() {
  return Q == Q8_0 ? 34 : Q == Q4_0 ? 18 : 20;
}

static inline vi vi_bcast4(const int8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return vi_set1(v);
}

// VW lanes (rows 16 g + h VW ..) of packed group `grp` (nb blocks) against MC x rows of the Q8
// form: y[m * ldy + lane] for m < MC (y at the group's first row, lane offset h VW).
template <int Q, int MC>
static inline void q8p_lanes(const uint8_t* grp, int64_t nb, int h, const XForms& x, int64_t K,
                             float* y, int64_t ldy) {
  constexpr int64_t BB = q8p_block_bytes<Q>();
  constexpr int64_t HDR = Q == Q4_1 ? 64 : 32;
  constexpr int NP = MC <= 2 ? 2 : 1;  // NOTE: partial integer sums: shorter dot chains at small MC
  vf acc[MC];
  _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) acc[m] = vzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * PACK_ROWS * BB;
    const vf dw = vload_f16((const uint16_t*)blk + h * VW);
    vf mn = vzero();
    if (Q == Q4_1) mn = vload_f16((const uint16_t*)(blk + 32) + h * VW);
    if (Q == Q4_0) mn = vmul(dw, vset1(-8.0f));
    const uint8_t* codes = blk + HDR + h * VW * 4;
    vi p[MC][NP];
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) for (int i = 0; i < NP; ++i) p[m][i] =
        vi_zero();
    if (Q == Q8_0) {
      _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t) {
        const vi c = vi_bias128(vi_load(codes + t * 64));  // NOTE: the identity without XOR
        _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
          const vi s = vi_bcast4(x.q8 + m * K + b * 32 + 4 * t);
          p[m][t % NP] = Q8_XOR ? vi_dot(p[m][t % NP], c, s) : vi_sdot(p[m][t % NP], c, s);
        }
      }
    } else {
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; ++c) {
        const vi z = vi_load(codes + c * 64), lo = vi_lo4(z), hi = vi_hi4(z);
        _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
          const int8_t* xb = x.q8 + m * K + b * 32;
          if (DOT16) {
            p[m][0] = vi_dot16(p[m][0], lo, vi_bcast4(xb + 4 * c));
            p[m][NP - 1] = vi_dot16(p[m][NP - 1], hi, vi_bcast4(xb + 16 + 4 * c));
          } else {
            p[m][0] = vi_dot(p[m][0], lo, vi_bcast4(xb + 4 * c));
            p[m][NP - 1] = vi_dot(p[m][NP - 1], hi, vi_bcast4(xb + 16 + 4 * c));
          }
        }
      }
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) {
      vi P;
      if (Q != Q8_0 && DOT16) P = vi_widen16(NP == 2 ? vi_add16(p[m][0], p[m][1]) : p[m][0]);
      else P = NP == 2 ? vi_add(p[m][0], p[m][1]) : p[m][0];
      if (Q == Q8_0 && Q8_XOR) P = vi_sub(P, vi_set1(x.si[m * (K / 32) + b] * 128));
      const vf t = vmul(vi_cvt(P), vset1(x.d8[m * (K / 32) + b]));
      acc[m] = vfma(t, dw, acc[m]);
      if (Q != Q8_0) acc[m] = vfma(mn, vset1(x.s8[m * (K / 32) + b]), acc[m]);
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < MC; ++m) vstore(y + m * ldy + h * VW, acc[m]);
}

// NOTE: x rows per tile: a group's blocks stay in L1 while the tiles of x pass (AVX2: 4, as its
// 16 registers hold 4 rows' partial sums and accumulators).
static constexpr int Q8P_MR = VW == 16 ? 8 : 4;

// Rows [n0, n1) (multiples of 16) of a packed weight against x [M, K] in the Q8 form.
template <int Q>
static void q8p_rows(const XForms& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
                     int64_t n1, float* y, int64_t ldy) {
  constexpr int64_t BB = q8p_block_bytes<Q>();
  const int64_t nb = K / 32;
  for (int64_t g = n0 / PACK_ROWS; g < n1 / PACK_ROWS; ++g) {
    const uint8_t* grp = w + g * nb * PACK_ROWS * BB;
    float* yg = y + g * PACK_ROWS;
    for (int h = 0; h < PACK_ROWS / VW; ++h) {
      int64_t m = 0;
      for (; m + Q8P_MR <= M; m += Q8P_MR)
        q8p_lanes<Q, Q8P_MR>(grp, nb, h, x.from_row(m, K), K, yg + m * ldy, ldy);
      if (Q8P_MR > 4 && m + 4 <= M)
        q8p_lanes<Q, 4>(grp, nb, h, x.from_row(m, K), K, yg + m * ldy, ldy), m += 4;
      if (m + 2 <= M) q8p_lanes<Q, 2>(grp, nb, h, x.from_row(m, K), K, yg + m * ldy, ldy), m += 2;
      if (m < M) q8p_lanes<Q, 1>(grp, nb, h, x.from_row(m, K), K, yg + m * ldy, ldy);
    }
  }
}

static inline void packed_rows(int qtype, const XForms& x, int64_t M, int64_t K,
                               const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (qtype - QPACK) {
    case Q4_0: q8p_rows<Q4_0>(x, M, K, w, n0, n1, y, ldy); return;
    case Q4_1: q8p_rows<Q4_1>(x, M, K, w, n0, n1, y, ldy); return;
    case Q8_0: q8p_rows<Q8_0>(x, M, K, w, n0, n1, y, ldy); return;
  }
}
