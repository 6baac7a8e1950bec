// Row-range GEMV / skinny-GEMM kernels shared by linear.cpp (one linear layer per call, OpenMP
// over its rows) and decode.cpp (a whole decode step per call, its threads splitting each layer's
// rows themselves): output rows [n0, n1) of y = x W^T for M input rows, no threading here.
//
// Layout: x [M, K] fp32 row-major, W [N, K] (one output per row, as torch's Linear), y[m * ldy + n]
// fp32. Every W row is read from memory once per call whatever M is (the M input rows reuse it
// from L1), so at decode the kernels run at memory bandwidth.
//
// GGUF blocks (32 elements along K; little-endian):
//   Q8_0: fp16 d, int8 q[32]                          x = d * q
//   Q4_0: fp16 d, uint8 qs[16]                        x = d * (q - 8)
//   Q4_1: fp16 d, fp16 m, uint8 qs[16]                x = d * q + m
//   Q5_0: fp16 d, uint8 qh[4], uint8 qs[16]           x = d * (q - 16)
//   Q5_1: fp16 d, fp16 m, uint8 qh[4], uint8 qs[16]   x = d * q + m
//   4-bit part: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; Q5_x
//   add bit j of the little-endian uint32 qh as bit 4 of element j (j = 0..31).
// For these blocks  sum_j x_j w_j = d * sum_j q_j x_j + m * sum_j x_j  (m = -8 d for Q4_0, -16 d
// for Q5_0), so the per-block sums of x (`xsum`, `x_block_sums`) are computed once per input and
// shared by all rows (Q4_K/Q5_K use them too, one per 32-value sub-block; see kquants.h).
#pragma once
#include "kquants.h"
#include "linear_simd.h"

static inline bool is_kquant(int q) { return q == Q4_K || q == Q5_K || q == Q6_K; }
static inline int block_elems(int q) { return is_kquant(q) ? 256 : 32; }
static inline int block_bytes(int q) {
  if (is_kquant(q)) return kq_block_bytes(q);
  switch (q) {
    case Q8_0: return 34;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
  }
  return 18;  // Q4_0
}
static inline bool known_qtype(int q) {
  return q == Q4_0 || q == Q4_1 || q == Q5_0 || q == Q5_1 || q == Q8_0 || is_kquant(q);
}
// Whether the block dot needs the per-32 sums of x.
static inline bool needs_xsum(int q) { return q != Q8_0 && q != Q6_K; }

// xsum[m * (K / 32) + i] = sum of x[m, 32 i .. 32 i + 32).
static inline void x_block_sums(const float* x, int64_t M, int64_t K, float* xsum) {
  const int64_t n = M * (K / 32);
  for (int64_t i = 0; i < n; ++i) {
    const float* xb = x + (i / (K / 32)) * K + (i % (K / 32)) * 32;
    vf a = vload(xb);
    for (int j = VW; j < 32; j += VW) a = vfma(vset1(1.0f), vload(xb + j), a);
    xsum[i] = vsum(a);
  }
}

// ---- dense rows -------------------------------------------------------------------------------
// Four rows of W [n0, n0 + 4) against every x row: W streams from memory once, from L1 after.
template <int T>
static void dense_tile4(const float* x, int64_t M, int64_t K, const void* w, int64_t n0, float* y,
                        int64_t ldy) {
  const int64_t kv = K / VW * VW;
  const int esize = T == W_F32 ? 4 : 2;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t k = 0; k < kv; k += VW) {
      if (m == 0)  // NOTE: the next 4 rows into L1 as these stream (prefetch never faults)
        for (int r = 4; r < 8; ++r)
          _mm_prefetch((const char*)w + ((n0 + r) * K + k) * esize, _MM_HINT_T0);
      vf xv = vload(xm + k);
      a0 = vfma(load_w<T>(w, (n0 + 0) * K + k), xv, a0);
      a1 = vfma(load_w<T>(w, (n0 + 1) * K + k), xv, a1);
      a2 = vfma(load_w<T>(w, (n0 + 2) * K + k), xv, a2);
      a3 = vfma(load_w<T>(w, (n0 + 3) * K + k), xv, a3);
    }
    float s[4] = {vsum(a0), vsum(a1), vsum(a2), vsum(a3)};
    for (int64_t k = kv; k < K; ++k)
      for (int r = 0; r < 4; ++r) s[r] += scalar_w<T>(w, (n0 + r) * K + k) * xm[k];
    for (int r = 0; r < 4; ++r) y[m * ldy + n0 + r] = s[r];
  }
}

template <int T>
static void dense_row(const float* x, int64_t M, int64_t K, const void* w, int64_t n, float* y,
                      int64_t ldy) {
  const int64_t kv = K / VW * VW;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    vf a = vzero();
    for (int64_t k = 0; k < kv; k += VW) a = vfma(load_w<T>(w, n * K + k), vload(xm + k), a);
    float s = vsum(a);
    for (int64_t k = kv; k < K; ++k) s += scalar_w<T>(w, n * K + k) * xm[k];
    y[m * ldy + n] = s;
  }
}

template <int T>
static void dense_rows(const float* x, int64_t M, int64_t K, const void* w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) dense_tile4<T>(x, M, K, w, n, y, ldy);
  for (; n < n1; ++n) dense_row<T>(x, M, K, w, n, y, ldy);
}

// ---- GGUF blocks ------------------------------------------------------------------------------
// acc += d * the dot of 32 byte values q (lo: elements 0..15, hi: 16..31) with xb[0..31].
static inline void q_lohi_dot(__m128i lo, __m128i hi, const float* xb, vf& acc, float d) {
  const vf p = vfma(vset1(1.0f), madd16_u8(lo, xb, vzero()), madd16_u8(hi, xb + 16, vzero()));
  acc = vfma(p, vset1(d), acc);
}

// The two nibble halves of a 4-bit block's 16 bytes.
static inline void q4_nibbles(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  __m128i b = _mm_loadu_si128((const __m128i*)qs);
  lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
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

static inline void q8_block_dot(const int8_t* qs, const float* xb, vf& acc, float d) {
  vf p = vmul(vload_i8(qs), vload(xb));
  for (int j = VW; j < 32; j += VW) p = vfma(vload_i8(qs + j), vload(xb + j), p);
  acc = vfma(p, vset1(d), acc);
}

// The two fp16 values at p as fp32 lanes 0 and 1.
static inline __m128 f16x2_at(const uint8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

static inline vf vbroadcast0(__m128 a) {
#if VW == 16
  return _mm512_broadcastss_ps(a);
#else
  return _mm256_broadcastss_ps(a);
#endif
}

static inline float f16_at(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return half_to_float(h);
}

// acc (+ extra, the scalar min terms) += the dot of block b of a row of type Q with xm.
template <int Q>
static inline void quant_block(const uint8_t* row, const float* xm, const float* xsum, int64_t b,
                               vf& acc, float& extra) {
  const float* xb = xm + b * block_elems(Q);
  const uint8_t* blk = row + b * block_bytes(Q);
  __m128i lo, hi, hlo, hhi;
  if (Q == Q4_K || Q == Q5_K) {
    q45k_dot<Q>(blk, xb, xsum + b * 8, acc, extra);
  } else if (Q == Q6_K) {
    q6k_dot(blk, xb, acc);
  } else if (Q == Q8_0) {
    q8_block_dot((const int8_t*)(blk + 2), xb, acc, f16_at(blk));
  } else if (Q == Q4_0) {
    const float d = f16_at(blk);
    q4_nibbles(blk + 2, lo, hi);
    q_lohi_dot(lo, hi, xb, acc, d);
    extra -= 8.0f * d * xsum[b];
  } else if (Q == Q4_1) {
    const __m128 dm = f16x2_at(blk);  // d, m in lanes 0, 1: one conversion for both
    q4_nibbles(blk + 4, lo, hi);
    const vf p = vfma(vset1(1.0f), madd16_u8(lo, xb, vzero()), madd16_u8(hi, xb + 16, vzero()));
    acc = vfma(p, vbroadcast0(dm), acc);
    extra += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * xsum[b];
  } else if (Q == Q5_0) {
    const float d = f16_at(blk);
    q4_nibbles(blk + 6, lo, hi);
    q5_high_bits(blk + 2, hlo, hhi);
    q_lohi_dot(_mm_or_si128(lo, hlo), _mm_or_si128(hi, hhi), xb, acc, d);
    extra -= 16.0f * d * xsum[b];
  } else {  // Q5_1
    const __m128 dm = f16x2_at(blk);
    q4_nibbles(blk + 8, lo, hi);
    q5_high_bits(blk + 4, hlo, hhi);
    lo = _mm_or_si128(lo, hlo);
    hi = _mm_or_si128(hi, hhi);
    const vf p = vfma(vset1(1.0f), madd16_u8(lo, xb, vzero()), madd16_u8(hi, xb + 16, vzero()));
    acc = vfma(p, vbroadcast0(dm), acc);
    extra += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * xsum[b];
  }
}

// The dot of one row of nb blocks of type Q with xm (xsum: its per-32 sums, where needed).
// NOTE: two accumulators (even / odd blocks) halve the FMA dependency chain through `acc`.
template <int Q>
static float quant_row_dot(const uint8_t* row, const float* xm, const float* xsum, int64_t nb) {
  vf acc0 = vzero(), acc1 = vzero();
  float extra0 = 0.0f, extra1 = 0.0f;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    quant_block<Q>(row, xm, xsum, b, acc0, extra0);
    quant_block<Q>(row, xm, xsum, b + 1, acc1, extra1);
  }
  if (b < nb) quant_block<Q>(row, xm, xsum, b, acc0, extra0);
  return vsum(vfma(vset1(1.0f), acc0, acc1)) + (extra0 + extra1);
}

// ---- several x rows per weight row (batched decode) -------------------------------------------
// A 32-value block expanded to fp32 once, as 32 / VW vectors scaled by d (`w`), plus the factor of
// the x block's sum (`mc`: m, or -8 d / -16 d, 0 for Q8_0), then applied to every x row: the
// expansion, the costly part, is not repeated per row.
static constexpr int NV = 32 / VW;

static inline void u8x16_to_vf(__m128i q, vf* out, const vf d) {
#if VW == 16
  out[0] = vmul(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), d);
#else
  out[0] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), d);
  out[1] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), d);
#endif
}

template <int Q>
static inline float expand_block(const uint8_t* blk, vf* w) {
  __m128i lo, hi, hlo, hhi;
  const float d = f16_at(blk);
  const vf dv = vset1(d);
  if (Q == Q8_0) {
    for (int v = 0; v < NV; ++v) w[v] = vmul(vload_i8((const int8_t*)(blk + 2) + v * VW), dv);
    return 0.0f;
  }
  const bool has_min = Q == Q4_1 || Q == Q5_1, five = Q == Q5_0 || Q == Q5_1;
  q4_nibbles(blk + (has_min ? 4 : 2) + (five ? 4 : 0), lo, hi);
  if (five) {
    q5_high_bits(blk + (has_min ? 4 : 2), hlo, hhi);
    lo = _mm_or_si128(lo, hlo);
    hi = _mm_or_si128(hi, hhi);
  }
  u8x16_to_vf(lo, w, dv);
  u8x16_to_vf(hi, w + NV / 2, dv);
  return has_min ? f16_at(blk + 2) : (five ? -16.0f : -8.0f) * d;
}

// y[m * ldy] for m < MC = the dot of one row of nb 32-value blocks with x rows m (stride K).
template <int Q, int MC>
static void quant_row_multi(const uint8_t* row, const float* x, int64_t K, const float* xsum,
                            int64_t nb, float* y, int64_t ldy) {
  vf acc[MC][2];
  float extra[MC];
  for (int m = 0; m < MC; ++m) acc[m][0] = acc[m][1] = vzero(), extra[m] = 0.0f;
  vf w[NV];
  for (int64_t b = 0; b < nb; ++b) {
    const float mc = expand_block<Q>(row + b * block_bytes(Q), w);
    for (int m = 0; m < MC; ++m) {
      const float* xb = x + m * K + b * 32;
      for (int v = 0; v < NV; ++v) acc[m][v & 1] = vfma(w[v], vload(xb + v * VW), acc[m][v & 1]);
      if (Q != Q8_0) extra[m] += mc * xsum[m * (K / 32) + b];
    }
  }
  for (int m = 0; m < MC; ++m) y[m * ldy] = vsum(vfma(vset1(1.0f), acc[m][0], acc[m][1])) + extra[m];
}

template <int Q>
static void quant_rows_t(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* xsum,
                         int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t nb = K / block_elems(Q);
  const int64_t row_bytes = nb * block_bytes(Q);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    if (n + 2 < n1)  // NOTE: the row after next into L1 while this one computes (2x at batch 1)
      for (int64_t o = 0; o < row_bytes; o += 64)
        _mm_prefetch((const char*)(row + 2 * row_bytes + o), _MM_HINT_T0);
    int64_t m = 0;
    if (!is_kquant(Q) && M > 1) {  // NOTE: batched decode: expand each block once for <= 8 rows
      const int64_t s = K / 32;
#if VW == 16  // 32 vector registers: 8 rows' accumulators fit
      for (; m + 8 <= M; m += 8)
        quant_row_multi<Q, 8>(row, x + m * K, K, xsum + m * s, nb, y + m * ldy + n, ldy);
#endif
      for (; m + 4 <= M; m += 4)
        quant_row_multi<Q, 4>(row, x + m * K, K, xsum + m * s, nb, y + m * ldy + n, ldy);
      for (; m + 2 <= M; m += 2)
        quant_row_multi<Q, 2>(row, x + m * K, K, xsum + m * s, nb, y + m * ldy + n, ldy);
    }
    for (; m < M; ++m)
      y[m * ldy + n] = quant_row_dot<Q>(row, x + m * K, xsum + m * (K / 32), nb);
  }
}

// Rows [n0, n1) of a GGUF-block weight of `qtype` (checked by the caller: known_qtype, K a
// multiple of block_elems); xsum as x_block_sums (unused for Q8_0/Q6_K).
static inline void quant_rows(int qtype, const float* x, int64_t M, int64_t K, const uint8_t* w,
                              const float* xsum, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (qtype) {
    case Q4_K: quant_rows_t<Q4_K>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q5_K: quant_rows_t<Q5_K>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q6_K: quant_rows_t<Q6_K>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q8_0: quant_rows_t<Q8_0>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q4_0: quant_rows_t<Q4_0>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q4_1: quant_rows_t<Q4_1>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q5_0: quant_rows_t<Q5_0>(x, M, K, w, xsum, n0, n1, y, ldy); return;
    case Q5_1: quant_rows_t<Q5_1>(x, M, K, w, xsum, n0, n1, y, ldy); return;
  }
}

// Rows [n0, n1) of a dense weight of `wtype` (W_F32 / W_F16 / W_BF16).
static inline void dense_rows_any(int wtype, const float* x, int64_t M, int64_t K, const void* w,
                                  int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (wtype) {
    case W_F32: dense_rows<W_F32>(x, M, K, w, n0, n1, y, ldy); return;
    case W_F16: dense_rows<W_F16>(x, M, K, w, n0, n1, y, ldy); return;
    case W_BF16: dense_rows<W_BF16>(x, M, K, w, n0, n1, y, ldy); return;
  }
}
