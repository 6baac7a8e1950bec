// radixlm CPU kernels: small-batch linear layers (GEMV / skinny GEMM) over fp32, fp16, bf16 and
// GGUF block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the K-quants Q4_K, Q5_K, Q6_K of
// kquants.h), plus block de-quantisation for the GEMM path. The row kernels and the block layouts
// are in gemv.h; this file is their C ABI, OpenMP splitting the N output rows.
//
// One source, compiled twice by kernels/cpu/build.py: with -mavx2 -mfma -mf16c (8 lanes) and with
// AVX-512 F/BW/VL/DQ as well (16 lanes); Python picks the library at run time from the CPU's
// features. A plain C ABI (called through ctypes): no torch headers, builds in seconds.
#include <algorithm>
#include <vector>

#include "gemv.h"

// Work items of y [M, N]: blocks of M_BLOCK x rows by chunks of N_CHUNK weight rows. A chunk's
// weights stay in L2 while the block's x rows stream past; at decode (M <= M_BLOCK) the items
// are the chunks, each weight row read from memory once per call.
// NOTE: N_CHUNK is a multiple of PACK_ROWS (a chunk of a packed weight is whole groups).
static constexpr int64_t N_CHUNK = 32, M_BLOCK = 256;

template <class F>
static void over_tiles(int64_t M, int64_t N, F&& f) {
  const int64_t nn = (N + N_CHUNK - 1) / N_CHUNK, nm = (M + M_BLOCK - 1) / M_BLOCK;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < nn * nm; ++t) {
    const int64_t i = t % nn, j = t / nn;
    const int64_t m0 = j * M_BLOCK, n0 = i * N_CHUNK;
    f(m0, std::min(M, m0 + M_BLOCK), n0, std::min(N, n0 + N_CHUNK));
  }
}

template <int T>
static void dense(const float* x, int64_t M, int64_t K, const void* w, int64_t N, float* y) {
  over_tiles(M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    dense_rows<T>(x + m0 * K, m1 - m0, K, w, n0, n1, y + m0 * N, N);
  });
}

static void quant(int qtype, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                  float* y) {
  XBuf buf;
  const XForms xf = buf.prepare(x, M, K, needs_xsum(qtype), reads_q8(qtype));
  over_tiles(M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    quant_rows(qtype, xf.from_row(m0, K), m1 - m0, K, w, n0, n1, y + m0 * N, N);
  });
}

template <int Q>
static void dequant_block(const uint8_t* blk, float* o) {
  if (is_kquant(Q)) {
    kq_dequant<Q>(blk, o);
    return;
  }
  const float d = f16_at(blk);
  if (Q == Q8_0) {
    for (int j = 0; j < 32; ++j) o[j] = d * (float)((const int8_t*)(blk + 2))[j];
    return;
  }
  const bool has_min = Q == Q4_1 || Q == Q5_1;
  const bool five = Q == Q5_0 || Q == Q5_1;
  const float m = has_min ? f16_at(blk + 2) : (five ? -16.0f * d : -8.0f * d);
  const uint8_t* qs = blk + (has_min ? 4 : 2) + (five ? 4 : 0);
  uint32_t qh = 0;
  if (five) memcpy(&qh, blk + (has_min ? 4 : 2), 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | (five ? ((qh >> j) & 1) << 4 : 0);
    const int hi = (qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0);
    o[j] = d * (float)lo + m;
    o[j + 16] = d * (float)hi + m;
  }
}

template <int Q>
static void dequant_rows(const uint8_t* w, int64_t N, int64_t K, float* out) {
  const int64_t nb = K / block_elems(Q);
  const int64_t row_bytes = nb * block_bytes(Q);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b)
      dequant_block<Q>(w + n * row_bytes + b * block_bytes(Q), out + n * K + b * block_elems(Q));
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
  if (!known_qtype(qtype)) return -1;
  if (K % block_elems(qtype) || K / 32 > Q8_MAX_BLOCKS) return -2;
  if (is_packed(qtype) && N % PACK_ROWS) return -2;
  quant(qtype, x, M, K, w, N, y);
  return 0;
}

// out[N, K] fp32 = the GGUF rows de-quantised (the prefill path's GEMM operand).
int rl_dequant(const uint8_t* w, int qtype, int64_t N, int64_t K, float* out) {
  if (!known_qtype(qtype)) return -1;
  if (K % block_elems(qtype)) return -2;
  switch (qtype) {
    case Q4_K: dequant_rows<Q4_K>(w, N, K, out); return 0;
    case Q5_K: dequant_rows<Q5_K>(w, N, K, out); return 0;
    case Q6_K: dequant_rows<Q6_K>(w, N, K, out); return 0;
    case Q8_0: dequant_rows<Q8_0>(w, N, K, out); return 0;
    case Q4_0: dequant_rows<Q4_0>(w, N, K, out); return 0;
    case Q4_1: dequant_rows<Q4_1>(w, N, K, out); return 0;
    case Q5_0: dequant_rows<Q5_0>(w, N, K, out); return 0;
    case Q5_1: dequant_rows<Q5_1>(w, N, K, out); return 0;
  }
  return -1;
}
}
