// radixlm CPU kernels: small-batch linear layers (GEMV / skinny GEMM) over fp32, fp16, bf16 and
// GGUF block-quantised weights (Q8_0, Q4_0, Q4_1; the K-quants Q4_K, Q5_K, Q6_K of kquants.h),
// plus block de-quantisation for the GEMM path.
//
// One source, compiled twice by kernels/cpu/build.py: with -mavx2 -mfma -mf16c (8 lanes) and with
// AVX-512 F/BW/VL/DQ as well (16 lanes); Python picks the library at run time from the CPU's
// features. A plain C ABI (called through ctypes): no torch headers, builds in seconds.
//
// Layout: x [M, K] fp32 row-major, W [N, K] (one output per row, as torch's Linear), y [M, N]
// fp32. Every W row is read from memory once per call whatever M is (the M input rows reuse it
// from L1), so at decode the kernels run at memory bandwidth. OpenMP splits the N rows.
//
// GGUF blocks (32 elements along K; little-endian):
//   Q8_0: fp16 d, int8 q[32]                   x = d * q
//   Q4_0: fp16 d, uint8 qs[16]                 x = d * (q - 8)
//   Q4_1: fp16 d, fp16 m, uint8 qs[16]         x = d * q + m
//   4-bit: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
// For 4-bit blocks  sum_j x_j w_j = d * sum_j q_j x_j + m * sum_j x_j  (m = -8 d for Q4_0), so the
// per-block sums of x are computed once per call and shared by all rows (Q4_K/Q5_K use them too,
// one per 32-value sub-block; see kquants.h for the 256-value super-blocks).
#include "kquants.h"
#include "linear_simd.h"

#include <vector>

// Four rows of W [n0, n0 + 4) against every x row: W streams from memory once, from L1 after.
template <int T>
static void dense_tile4(const float* x, int64_t M, int64_t K, const void* w, int64_t N, int64_t n0,
                        float* y) {
  const int64_t kv = K / VW * VW;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t k = 0; k < kv; k += VW) {
      vf xv = vload(xm + k);
      a0 = vfma(load_w<T>(w, (n0 + 0) * K + k), xv, a0);
      a1 = vfma(load_w<T>(w, (n0 + 1) * K + k), xv, a1);
      a2 = vfma(load_w<T>(w, (n0 + 2) * K + k), xv, a2);
      a3 = vfma(load_w<T>(w, (n0 + 3) * K + k), xv, a3);
    }
    float s[4] = {vsum(a0), vsum(a1), vsum(a2), vsum(a3)};
    for (int64_t k = kv; k < K; ++k)
      for (int r = 0; r < 4; ++r) s[r] += scalar_w<T>(w, (n0 + r) * K + k) * xm[k];
    for (int r = 0; r < 4; ++r) y[m * N + n0 + r] = s[r];
  }
}

template <int T>
static void dense_row(const float* x, int64_t M, int64_t K, const void* w, int64_t N, int64_t n,
                      float* y) {
  const int64_t kv = K / VW * VW;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    vf a = vzero();
    for (int64_t k = 0; k < kv; k += VW) a = vfma(load_w<T>(w, n * K + k), vload(xm + k), a);
    float s = vsum(a);
    for (int64_t k = kv; k < K; ++k) s += scalar_w<T>(w, n * K + k) * xm[k];
    y[m * N + n] = s;
  }
}

template <int T>
static void dense(const float* x, int64_t M, int64_t K, const void* w, int64_t N, float* y) {
  const int64_t tiles = N / 4;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) dense_tile4<T>(x, M, K, w, N, t * 4, y);
  for (int64_t n = tiles * 4; n < N; ++n) dense_row<T>(x, M, K, w, N, n, y);
}

// ---- GGUF blocks ------------------------------------------------------------------------------
static inline bool is_kquant(int q) { return q == Q4_K || q == Q5_K || q == Q6_K; }
static inline int block_elems(int q) { return is_kquant(q) ? 256 : 32; }
static inline int block_bytes(int q) {
  return is_kquant(q) ? kq_block_bytes(q) : (q == Q8_0 ? 34 : (q == Q4_1 ? 20 : 18));
}

// acc += d * the dot of one 4-bit block's 32 nibble values with xb[0..31].
static inline void q4_block_dot(const uint8_t* qs, const float* xb, vf& acc, float d) {
  __m128i b = _mm_loadu_si128((const __m128i*)qs);
  __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
  acc = vfma(madd16_u8(hi, xb + 16, madd16_u8(lo, xb, vzero())), vset1(d), acc);
}

static inline void q8_block_dot(const int8_t* qs, const float* xb, vf& acc, float d) {
  vf p = vmul(vload_i8(qs), vload(xb));
  for (int j = VW; j < 32; j += VW) p = vfma(vload_i8(qs + j), vload(xb + j), p);
  acc = vfma(p, vset1(d), acc);
}

template <int Q>
static float quant_row_dot(const uint8_t* row, const float* xm, const float* xsum, int64_t nb) {
  vf acc = vzero();
  float extra = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {  // nb blocks of block_elems(Q) values
    const float* xb = xm + b * block_elems(Q);
    if (Q == Q4_K || Q == Q5_K) {
      q45k_dot<Q>(row + b * block_bytes(Q), xb, xsum + b * 8, acc, extra);
    } else if (Q == Q6_K) {
      q6k_dot(row + b * block_bytes(Q), xb, acc);
    } else if (Q == Q8_0) {
      const uint8_t* blk = row + b * 34;
      uint16_t dh;
      memcpy(&dh, blk, 2);
      q8_block_dot((const int8_t*)(blk + 2), xb, acc, half_to_float(dh));
    } else if (Q == Q4_0) {
      const uint8_t* blk = row + b * 18;
      uint16_t dh;
      memcpy(&dh, blk, 2);
      float d = half_to_float(dh);
      q4_block_dot(blk + 2, xb, acc, d);
      extra -= 8.0f * d * xsum[b];
    } else {
      const uint8_t* blk = row + b * 20;
      uint16_t dh, mh;
      memcpy(&dh, blk, 2);
      memcpy(&mh, blk + 2, 2);
      q4_block_dot(blk + 4, xb, acc, half_to_float(dh));
      extra += half_to_float(mh) * xsum[b];
    }
  }
  return vsum(acc) + extra;
}

template <int Q>
static void quant(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y) {
  const int64_t nb = K / block_elems(Q);
  const int64_t row_bytes = nb * block_bytes(Q);
  std::vector<float> xsum(Q == Q8_0 || Q == Q6_K ? 0 : M * (K / 32));  // per 32 values of x
  for (int64_t i = 0; i < (int64_t)xsum.size(); ++i) {
    const float* xb = x + i * 32;
    float s = 0.0f;
    for (int j = 0; j < 32; ++j) s += xb[j];
    xsum[i] = s;
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = w + n * row_bytes;
    for (int64_t m = 0; m < M; ++m)
      y[m * N + n] = quant_row_dot<Q>(row, x + m * K, xsum.data() + m * (K / 32), nb);
  }
}

template <int Q>
static void dequant_rows(const uint8_t* w, int64_t N, int64_t K, float* out) {
  const int64_t nb = K / block_elems(Q);
  const int64_t row_bytes = nb * block_bytes(Q);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + n * row_bytes + b * block_bytes(Q);
      float* o = out + n * K + b * block_elems(Q);
      if (is_kquant(Q)) {
        kq_dequant<Q>(blk, o);
        continue;
      }
      uint16_t dh;
      memcpy(&dh, blk, 2);
      const float d = half_to_float(dh);
      if (Q == Q8_0) {
        for (int j = 0; j < 32; ++j) o[j] = d * (float)((const int8_t*)(blk + 2))[j];
        continue;
      }
      float m = -8.0f * d;
      const uint8_t* qs = blk + 2;
      if (Q == Q4_1) {
        uint16_t mh;
        memcpy(&mh, blk + 2, 2);
        m = half_to_float(mh);
        qs = blk + 4;
      }
      for (int j = 0; j < 16; ++j) {
        o[j] = d * (float)(qs[j] & 0x0F) + m;
        o[j + 16] = d * (float)(qs[j] >> 4) + m;
      }
    }
  }
}

extern "C" {

int rl_simd_width() { return VW; }

void rl_set_threads(int n) { omp_set_num_threads(n); }

// y[M, N] = x[M, K] @ W[N, K]^T, W of `wtype` (0 fp32, 1 fp16, 2 bf16). Returns 0, or -1 for an
// unknown type.
int rl_linear_dense(const float* x, int64_t M, int64_t K, const void* w, int wtype, int64_t N,
                    float* y) {
  switch (wtype) {
    case W_F32: dense<W_F32>(x, M, K, w, N, y); return 0;
    case W_F16: dense<W_F16>(x, M, K, w, N, y); return 0;
    case W_BF16: dense<W_BF16>(x, M, K, w, N, y); return 0;
  }
  return -1;
}

// y[M, N] = x[M, K] @ dequant(W)^T for GGUF blocks of ggml type `qtype`; K a multiple of the
// block size (32; 256 for K-quants). Returns 0, -1 for an unknown type, -2 for a bad K.
int rl_linear_quant(const float* x, int64_t M, int64_t K, const uint8_t* w, int qtype, int64_t N,
                    float* y) {
  if (K % block_elems(qtype)) return -2;
  switch (qtype) {
    case Q4_K: quant<Q4_K>(x, M, K, w, N, y); return 0;
    case Q5_K: quant<Q5_K>(x, M, K, w, N, y); return 0;
    case Q6_K: quant<Q6_K>(x, M, K, w, N, y); return 0;
    case Q8_0: quant<Q8_0>(x, M, K, w, N, y); return 0;
    case Q4_0: quant<Q4_0>(x, M, K, w, N, y); return 0;
    case Q4_1: quant<Q4_1>(x, M, K, w, N, y); return 0;
  }
  return -1;
}

// out[N, K] fp32 = the GGUF rows de-quantised (the prefill path's GEMM operand).
int rl_dequant(const uint8_t* w, int qtype, int64_t N, int64_t K, float* out) {
  if (K % block_elems(qtype)) return -2;
  switch (qtype) {
    case Q4_K: dequant_rows<Q4_K>(w, N, K, out); return 0;
    case Q5_K: dequant_rows<Q5_K>(w, N, K, out); return 0;
    case Q6_K: dequant_rows<Q6_K>(w, N, K, out); return 0;
    case Q8_0: dequant_rows<Q8_0>(w, N, K, out); return 0;
    case Q4_0: dequant_rows<Q4_0>(w, N, K, out); return 0;
    case Q4_1: dequant_rows<Q4_1>(w, N, K, out); return 0;
  }
  return -1;
}
}
