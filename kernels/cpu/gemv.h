// Row-range GEMV / GEMM kernels shared by linear.cpp (one linear layer per call, OpenMP over its
// rows) and decode.cpp (a whole decode step per call, its threads splitting each layer's rows
// themselves): output rows [n0, n1) of y = x W^T for M input rows, no threading here.
//
// Layout: x [M, K] fp32 row-major, W [N, K] (one output per row, as torch's Linear), y[m * ldy + n]
// fp32. A weight row (or tile of rows) is read once per tile of x rows, so at decode every W row
// is read from memory once per call whatever M is and the kernels run at memory bandwidth.
//
// Batch invariance. Every output y[m, n] is computed by the same operations in the same order
// whether its row m is alone (a decode step of one request), in a batch of decode rows or in a
// prefill chunk of any size: the tiles (of weight rows and of x rows) only decide which outputs
// share a load, never how one output accumulates. Dense rows: one SIMD accumulator per output over
// K in VW-wide steps, `vsum`, then the K % VW tail in order. GGUF blocks: q8dot.h (32-value blocks
// on Q8 activations) and, per row, `quant_row_dot` (K-quants on fp32 activations).
//
// GGUF blocks (32 elements along K; little-endian):
//   Q8_0: fp16 d, int8 q[32]                          x = d * q
//   Q4_0: fp16 d, uint8 qs[16]                        x = d * (q - 8)
//   Q4_1: fp16 d, fp16 m, uint8 qs[16]                x = d * q + m
//   Q5_0: fp16 d, uint8 qh[4], uint8 qs[16]           x = d * (q - 16)
//   Q5_1: fp16 d, fp16 m, uint8 qh[4], uint8 qs[16]   x = d * q + m
//   4-bit part: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; Q5_x
//   add bit j of the little-endian uint32 qh as bit 4 of element j (j = 0..31).
// K-quants (kquants.h) read x in fp32 plus its per-32 sums (`xsum`, `x_block_sums`).
#pragma once
#include "kquants.h"
#include "q8dot.h"

static inline bool is_kquant(int q) { return q == Q4_K || q == Q5_K || q == Q6_K; }
static inline int block_elems(int q) { return is_kquant(q) ? 256 : 32; }
static inline int block_bytes(int q) {
  if (is_kquant(q)) return kq_block_bytes(q);
  if (is_packed(q)) q -= QPACK;  // the same bytes per block, 16 rows interleaved
  switch (q) {
    case Q8_0: return 34;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
  }
  return 18;  // Q4_0
}
static inline bool known_qtype(int q) { return is_q8_block(q) || is_packed(q) || is_kquant(q); }
// Whether a block type reads x in the Q8 form (q8dot.h, q8pack.h).
static inline bool reads_q8(int q) { return is_q8_block(q) || is_packed(q); }
// Whether a block type reads the per-32 sums of fp32 x (K-quants with a min term).
static inline bool needs_xsum(int q) { return q == Q4_K || q == Q5_K; }

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

// An input x [M, K] in the forms the weight types read: fp32 (dense rows), with its per-32 sums
// (Q4_K / Q5_K), and Q8-quantised (the 32-value blocks, q8dot.h). Filled by `XBuf::prepare`.
struct XForms {
  const float* x;
  const float* xsum;  // [M, K / 32] or null
  const int8_t* q8;   // [M, K] or null
  const float* d8;    // [M, K / 32]
  const float* s8;
  const int32_t* si;

  XForms from_row(int64_t m, int64_t K) const {  // the same forms of rows [m, M)
    const int64_t nb = K / 32;
    return {x + m * K, xsum ? xsum + m * nb : nullptr, q8 ? q8 + m * K : nullptr,
            q8 ? d8 + m * nb : nullptr, q8 ? s8 + m * nb : nullptr, q8 ? si + m * nb : nullptr};
  }
};

// Owns the derived forms of one input (reused across calls by its owner: one per thread).
struct XBuf {
  std::vector<float> xsum, d8, s8;
  std::vector<int8_t> q8;
  std::vector<int32_t> si;

  XForms prepare(const float* x, int64_t M, int64_t K, bool sums, bool quant) {
    XForms f{x, nullptr, nullptr, nullptr, nullptr, nullptr};
    if (sums) {
      xsum.resize(M * (K / 32));
      x_block_sums(x, M, K, xsum.data());
      f.xsum = xsum.data();
    }
    if (quant) {
      const int64_t nb = K / 32;
      q8.resize(M * K), d8.resize(M * nb), s8.resize(M * nb), si.resize(M * nb);
      for (int64_t m = 0; m < M; ++m)
        q8_quantize_row(x + m * K, K, q8.data() + m * K, d8.data() + m * nb, s8.data() + m * nb,
                        si.data() + m * nb);
      f.q8 = q8.data(), f.d8 = d8.data(), f.s8 = s8.data(), f.si = si.data();
    }
    return f;
  }
};

#include "q8pack.h"  // NOTE: after XForms, which its kernels read

// ---- dense rows -------------------------------------------------------------------------------
// NR weight rows [n0, n0 + NR) x MR input rows [m0, m0 + MR): one accumulator per output.
template <int T, int NR, int MR>
static void dense_tile(const float* x, int64_t m0, int64_t K, const void* w, int64_t n0, float* y,
                       int64_t ldy, bool prefetch) {
  const int64_t kv = K / VW * VW;
  const int esize = T == W_F32 ? 4 : 2;
  vf acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < MR; ++c) acc[r][c] = vzero();
  for (int64_t k = 0; k < kv; k += VW) {
    if (prefetch)  // NOTE: the next NR rows into L1 as these stream (prefetch never faults)
      for (int r = NR; r < 2 * NR; ++r)
        _mm_prefetch((const char*)w + ((n0 + r) * K + k) * esize, _MM_HINT_T0);
    vf wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w<T>(w, (n0 + r) * K + k);
    for (int c = 0; c < MR; ++c) {
      const vf xv = vload(x + (m0 + c) * K + k);
      for (int r = 0; r < NR; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < MR; ++c) {
      const float* xm = x + (m0 + c) * K;
      float s = vsum(acc[r][c]);
      for (int64_t k = kv; k < K; ++k) s += scalar_w<T>(w, (n0 + r) * K + k) * xm[k];
      y[(m0 + c) * ldy + n0 + r] = s;
    }
}

// Input rows [m0, m0 + MR) against weight rows [n0, n1): 4-row tiles, then single rows. A single
// input row streams the weight one row at a time.
// NOTE: at MR = 1 interleaving 2 or 4 weight rows (with or without the software prefetch) halved
// the bandwidth of a whole decode step's weights (14.6 -> 24.4 GB/s fp32, 9.6 -> 21 GB/s fp16 on
// one AVX-512 core): the hardware prefetchers follow one stream far better than interleaved ones.
template <int T, int MR>
static void dense_strip(const float* x, int64_t m0, int64_t K, const void* w, int64_t n0,
                        int64_t n1, float* y, int64_t ldy, bool prefetch) {
  int64_t n = n0;
  if (MR > 1)
    for (; n + 4 <= n1; n += 4) dense_tile<T, 4, MR>(x, m0, K, w, n, y, ldy, prefetch);
  for (; n < n1; ++n) dense_tile<T, 1, MR>(x, m0, K, w, n, y, ldy, false);
}

// NOTE: MR input rows per tile (AVX-512: 4 x 6 accumulators of 32 registers; AVX2: 4 x 2 of 16).
// At M = 1 the 1-row strip streams the weight once, in order; the first wider strip prefetches.
static constexpr int DENSE_MR = VW == 16 ? 6 : 2;

template <int T>
static void dense_rows(const float* x, int64_t M, int64_t K, const void* w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  int64_t m = 0;
  for (; m + DENSE_MR <= M; m += DENSE_MR)
    dense_strip<T, DENSE_MR>(x, m, K, w, n0, n1, y, ldy, m == 0);
  for (; m < M; ++m) dense_strip<T, 1>(x, m, K, w, n0, n1, y, ldy, m == 0);
}

// ---- GGUF blocks ------------------------------------------------------------------------------
// acc (+ extra, the scalar min terms) += the dot of K-quant super-block b of a row with xm.
template <int Q>
static inline void kquant_block(const uint8_t* row, const float* xm, const float* xsum, int64_t b,
                                vf& acc, float& extra) {
  const float* xb = xm + b * 256;
  const uint8_t* blk = row + b * kq_block_bytes(Q);
  if (Q == Q6_K)
    q6k_dot(blk, xb, acc);
  else
    q45k_dot<Q>(blk, xb, xsum + b * 8, acc, extra);
}

// The dot of one row of nb K-quant super-blocks with xm (xsum: its per-32 sums, where needed).
// NOTE: two accumulators (even / odd blocks) halve the FMA dependency chain through `acc`.
template <int Q>
static float quant_row_dot(const uint8_t* row, const float* xm, const float* xsum, int64_t nb) {
  vf acc0 = vzero(), acc1 = vzero();
  float extra0 = 0.0f, extra1 = 0.0f;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    kquant_block<Q>(row, xm, xsum, b, acc0, extra0);
    kquant_block<Q>(row, xm, xsum, b + 1, acc1, extra1);
  }
  if (b < nb) kquant_block<Q>(row, xm, xsum, b, acc0, extra0);
  return vsum(vfma(vset1(1.0f), acc0, acc1)) + (extra0 + extra1);
}

template <int Q>
static void kquant_rows(const XForms& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
                        int64_t n1, float* y, int64_t ldy) {
  const int64_t nb = K / 256, row_bytes = nb * kq_block_bytes(Q);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    if (n + 2 < n1)  // NOTE: the row after next into L1 while this one computes (2x at batch 1)
      for (int64_t o = 0; o < row_bytes; o += 64)
        _mm_prefetch((const char*)(row + 2 * row_bytes + o), _MM_HINT_T0);
    for (int64_t m = 0; m < M; ++m)
      y[m * ldy + n] = quant_row_dot<Q>(row, x.x + m * K, x.xsum + m * (K / 32), nb);
  }
}

// Q8 rows [m, m + MC) against weight rows [n0, n1) (see q8dot.h).
template <int Q, int MC>
static void q8_strip(const XForms& x, int64_t m, int64_t K, const uint8_t* w, int64_t n0,
                     int64_t n1, float* y, int64_t ldy, bool prefetch) {
  const int64_t nb = K / 32, row_bytes = nb * block_bytes(Q);
  const float* d8x16 = nullptr;
#if VW == 16
  static thread_local std::vector<float> spread;  // NOTE: per thread, reused by every strip
  spread.resize(MC * (nb / 2) * 16);
  q8_spread(x.d8 + m * nb, nb, MC, spread.data());
  d8x16 = spread.data();
#endif
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    if (prefetch && n + 2 < n1)  // NOTE: the row after next into L1 (first strip: from memory)
      for (int64_t o = 0; o < row_bytes; o += 64)
        _mm_prefetch((const char*)(row + 2 * row_bytes + o), _MM_HINT_T0);
    q8_row_multi<Q, MC>(row, x.q8 + m * K, x.d8 + m * nb, x.s8 + m * nb, d8x16, K, nb,
                        y + m * ldy + n, ldy);
  }
}

// NOTE: x rows per strip: every block is unpacked once for them (AVX-512: 8 accumulators).
static constexpr int Q8_MR = VW == 16 ? 8 : 4;

template <int Q>
static void q8_rows(const XForms& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
                    int64_t n1, float* y, int64_t ldy) {
  int64_t m = 0;
  for (; m + Q8_MR <= M; m += Q8_MR) q8_strip<Q, Q8_MR>(x, m, K, w, n0, n1, y, ldy, m == 0);
  if (m + 4 <= M && Q8_MR > 4) q8_strip<Q, 4>(x, m, K, w, n0, n1, y, ldy, m == 0), m += 4;
  if (m + 2 <= M) q8_strip<Q, 2>(x, m, K, w, n0, n1, y, ldy, m == 0), m += 2;
  if (m < M) q8_strip<Q, 1>(x, m, K, w, n0, n1, y, ldy, m == 0);
}

// Rows [n0, n1) of a GGUF-block weight of `qtype` (checked by the caller: known_qtype, K a
// multiple of block_elems, K / 32 <= Q8_MAX_BLOCKS); x in the forms the type reads.
static inline void quant_rows(int qtype, const XForms& x, int64_t M, int64_t K, const uint8_t* w,
                              int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (is_packed(qtype)) return packed_rows(qtype, x, M, K, w, n0, n1, y, ldy);  // n0, n1: 16 | n
  switch (qtype) {
    case Q4_K: kquant_rows<Q4_K>(x, M, K, w, n0, n1, y, ldy); return;
    case Q5_K: kquant_rows<Q5_K>(x, M, K, w, n0, n1, y, ldy); return;
    case Q6_K: kquant_rows<Q6_K>(x, M, K, w, n0, n1, y, ldy); return;
    case Q8_0: q8_rows<Q8_0>(x, M, K, w, n0, n1, y, ldy); return;
    case Q4_0: q8_rows<Q4_0>(x, M, K, w, n0, n1, y, ldy); return;
    case Q4_1: q8_rows<Q4_1>(x, M, K, w, n0, n1, y, ldy); return;
    case Q5_0: q8_rows<Q5_0>(x, M, K, w, n0, n1, y, ldy); return;
    case Q5_1: q8_rows<Q5_1>(x, M, K, w, n0, n1, y, ldy); return;
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
