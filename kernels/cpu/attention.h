// Attention of one query (request position, head) over the paged KV pool: shared by attention.cpp
// (decode queries, and an extend's queries each over its own causal prefix) and decode.cpp (a
// whole decode step per call). See attention.cpp's header for the layout.
//
// NOTE: a query's output depends only on the query, its slots and its length L, never on the other
// queries of the call: keys go in groups of 8 from key 0 (each score: the fma chain over D, folded
// to 8 lanes, reduced by `reduce8x8`'s fixed tree), exp is `vexp8` per lane, the softmax total a
// lane-per-(key mod 8) sum then `hsum8`, and V accumulates key by key. So a decode step and an
// extend over the same tokens compute bitwise the same attention.
#pragma once
#include <math.h>

#include <algorithm>
#include <vector>

#include "activation.h"
#include "linear_simd.h"

static inline __m256 fold8(vf a) {
#if VW == 16
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
#else
  return a;
#endif
}

// Lane j = the sum of r[j]'s 8 lanes, ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
static inline __m256 reduce8x8(const __m256* r) {
  const __m256 t0 = _mm256_hadd_ps(r[0], r[1]), t1 = _mm256_hadd_ps(r[2], r[3]);
  const __m256 t2 = _mm256_hadd_ps(r[4], r[5]), t3 = _mm256_hadd_ps(r[6], r[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// NOTE: NV = D / VW as a constant where the head size is a common one (0: read from D), so that
// the per-head vectors (q, the V sums) live in registers; the arithmetic is the same either way.
template <int T, int NV>
static void decode_head_nv(const float* q, const void* kp, const void* vp, const int32_t* slots,
                           int64_t L, int64_t kvh, int64_t KVH, int64_t D, float scale, float* o,
                           std::vector<float>& s) {
  const int64_t groups = (L + 7) / 8, nv = NV ? NV : D / VW;
  s.resize(groups * 8);
  vf qv[16];  // D <= 16 * VW
  for (int64_t i = 0; i < nv; ++i) qv[i] = vload(q + i * VW);
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  float mx = -INFINITY;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 r[8];
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t key = g * 8 + j;
      r[j] = _mm256_setzero_ps();
      if (key >= L) continue;
      const int64_t off = ((int64_t)slots[key] * KVH + kvh) * D;
      vf a = vzero();
      for (int64_t i = 0; i < nv; ++i) a = vfma(load_w<T>(kp, off + i * VW), qv[i], a);
      r[j] = fold8(a);
    }
    const __m256 sc = _mm256_mul_ps(reduce8x8(r), _mm256_set1_ps(scale));
    _mm256_storeu_ps(s.data() + g * 8, sc);
    for (int64_t j = 0; j < 8 && g * 8 + j < L; ++j) mx = std::max(mx, s[g * 8 + j]);
  }
  __m256 tot = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m256 live = _mm256_cmp_ps(lane, _mm256_set1_ps((float)(L - g * 8)), _CMP_LT_OQ);
    const __m256 e = _mm256_and_ps(
        vexp8(_mm256_sub_ps(_mm256_loadu_ps(s.data() + g * 8), _mm256_set1_ps(mx))), live);
    _mm256_storeu_ps(s.data() + g * 8, e);
    tot = _mm256_add_ps(tot, e);
  }
  const float inv = 1.0f / hsum8(tot);
  vf acc[16];
  for (int64_t i = 0; i < nv; ++i) acc[i] = vzero();
  for (int64_t j = 0; j < L; ++j) {
    const int64_t off = ((int64_t)slots[j] * KVH + kvh) * D;
    const vf p = vset1(s[j] * inv);
    for (int64_t i = 0; i < nv; ++i) acc[i] = vfma(load_w<T>(vp, off + i * VW), p, acc[i]);
  }
  for (int64_t i = 0; i < nv; ++i) vstore(o + i * VW, acc[i]);
}

template <int T>
static void decode_head(const float* q, const void* kp, const void* vp, const int32_t* slots,
                        int64_t L, int64_t kvh, int64_t KVH, int64_t D, float scale, float* o,
                        std::vector<float>& s) {
  switch (D / VW) {
    case 4: return decode_head_nv<T, 4>(q, kp, vp, slots, L, kvh, KVH, D, scale, o, s);
    case 8: return decode_head_nv<T, 8>(q, kp, vp, slots, L, kvh, KVH, D, scale, o, s);
    default: return decode_head_nv<T, 0>(q, kp, vp, slots, L, kvh, KVH, D, scale, o, s);
  }
}

// decode_head for a block of queries that share a request's slots: query t attends to the first
// Ls[t] slots. Each query's arithmetic is decode_head's, in the same order (its output is bitwise
// decode_head's); the block only shares loads: a group of 8 K rows serves every query's scores
// while it sits in L1, a run of V rows every query's weighted sum. o[t] doubles as the query's
// running V sum between runs. s: per query, its scores then weights.
static constexpr int64_t V_RUN = 32;  // V rows shared by the block's queries at a time

template <int T, int NV>
static void attend_block_nv(const float* const* q, const int64_t* Ls, int64_t nq, const void* kp,
                            const void* vp, const int32_t* slots, int64_t kvh, int64_t KVH,
                            int64_t D, float scale, float* const* o, std::vector<float>* s) {
  const int64_t nv = NV ? NV : D / VW;
  int64_t Lmax = 0;
  for (int64_t t = 0; t < nq; ++t) {
    Lmax = std::max(Lmax, Ls[t]);
    s[t].resize((Ls[t] + 7) / 8 * 8);
  }
  std::vector<float> mx(nq, -INFINITY), inv(nq);
  for (int64_t g = 0; g < (Lmax + 7) / 8; ++g) {
    for (int64_t t = 0; t < nq; ++t) {
      if (g * 8 >= Ls[t]) continue;
      vf qv[16];
      for (int64_t i = 0; i < nv; ++i) qv[i] = vload(q[t] + i * VW);
      __m256 r[8];
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t key = g * 8 + j;
        r[j] = _mm256_setzero_ps();
        if (key >= Ls[t]) continue;
        const int64_t off = ((int64_t)slots[key] * KVH + kvh) * D;
        vf a = vzero();
        for (int64_t i = 0; i < nv; ++i) a = vfma(load_w<T>(kp, off + i * VW), qv[i], a);
        r[j] = fold8(a);
      }
      const __m256 sc = _mm256_mul_ps(reduce8x8(r), _mm256_set1_ps(scale));
      _mm256_storeu_ps(s[t].data() + g * 8, sc);
      for (int64_t j = 0; j < 8 && g * 8 + j < Ls[t]; ++j) mx[t] = std::max(mx[t], s[t][g * 8 + j]);
    }
  }
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t t = 0; t < nq; ++t) {
    __m256 tot = _mm256_setzero_ps();
    for (int64_t g = 0; g < (Ls[t] + 7) / 8; ++g) {
      const __m256 live = _mm256_cmp_ps(lane, _mm256_set1_ps((float)(Ls[t] - g * 8)), _CMP_LT_OQ);
      const __m256 e = _mm256_and_ps(
          vexp8(_mm256_sub_ps(_mm256_loadu_ps(s[t].data() + g * 8), _mm256_set1_ps(mx[t]))), live);
      _mm256_storeu_ps(s[t].data() + g * 8, e);
      tot = _mm256_add_ps(tot, e);
    }
    inv[t] = 1.0f / hsum8(tot);
    for (int64_t i = 0; i < nv; ++i) vstore(o[t] + i * VW, vzero());
  }
  for (int64_t j0 = 0; j0 < Lmax; j0 += V_RUN) {
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t j1 = std::min(Ls[t], j0 + V_RUN);
      if (j0 >= j1) continue;
      vf acc[16];
      for (int64_t i = 0; i < nv; ++i) acc[i] = vload(o[t] + i * VW);
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t off = ((int64_t)slots[j] * KVH + kvh) * D;
        const vf p = vset1(s[t][j] * inv[t]);
        for (int64_t i = 0; i < nv; ++i) acc[i] = vfma(load_w<T>(vp, off + i * VW), p, acc[i]);
      }
      for (int64_t i = 0; i < nv; ++i) vstore(o[t] + i * VW, acc[i]);
    }
  }
}

template <int T>
static void attend_block(const float* const* q, const int64_t* Ls, int64_t nq, const void* kp,
                         const void* vp, const int32_t* slots, int64_t kvh, int64_t KVH, int64_t D,
                         float scale, float* const* o, std::vector<float>* s) {
  switch (D / VW) {
    case 4: return attend_block_nv<T, 4>(q, Ls, nq, kp, vp, slots, kvh, KVH, D, scale, o, s);
    case 8: return attend_block_nv<T, 8>(q, Ls, nq, kp, vp, slots, kvh, KVH, D, scale, o, s);
    default: return attend_block_nv<T, 0>(q, Ls, nq, kp, vp, slots, kvh, KVH, D, scale, o, s);
  }
}
