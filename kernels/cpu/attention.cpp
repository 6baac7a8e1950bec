// radixlm CPU kernel: decode attention over the paged KV pool (one query token per request).
//
// Compiled into the same library as linear.cpp (kernels/cpu/build.py), with its vector helpers.
// Inputs: q [B, H, D] fp32; the pool's K and V [S, KVH, D] (fp32, fp16 or bf16); req_to_token
// [R, C] int32 (a request's positions -> slots); rows [B] and seq_lens [B] int64. Output o [B, H, D]
// fp32. Head h attends with KV head h / (H / KVH) (GQA). One OpenMP task per (request, head):
// scores over the request's L slots, a softmax, and the weighted sum of V; K/V rows are read
// straight from the pool through the table (no gather copy, no padding to the longest request).
#include <math.h>

#include <vector>

#include "linear_simd.h"

template <int T>
static void decode_head(const float* q, const void* kp, const void* vp, const int32_t* slots,
                        int64_t L, int64_t kvh, int64_t KVH, int64_t D, float scale, float* o,
                        std::vector<float>& s) {
  s.resize(L);
  float mx = -INFINITY;
  for (int64_t j = 0; j < L; ++j) {
    const int64_t off = ((int64_t)slots[j] * KVH + kvh) * D;
    vf a = vzero();
    for (int64_t d = 0; d < D; d += VW) a = vfma(load_w<T>(kp, off + d), vload(q + d), a);
    const float v = vsum(a) * scale;
    s[j] = v;
    mx = v > mx ? v : mx;
  }
  float total = 0.0f;
  for (int64_t j = 0; j < L; ++j) {
    s[j] = expf(s[j] - mx);
    total += s[j];
  }
  const float inv = 1.0f / total;
  vf acc[16];  // D <= 16 * VW
  const int64_t nv = D / VW;
  for (int64_t i = 0; i < nv; ++i) acc[i] = vzero();
  for (int64_t j = 0; j < L; ++j) {
    const int64_t off = ((int64_t)slots[j] * KVH + kvh) * D;
    const vf p = vset1(s[j] * inv);
    for (int64_t i = 0; i < nv; ++i) acc[i] = vfma(load_w<T>(vp, off + i * VW), p, acc[i]);
  }
  for (int64_t i = 0; i < nv; ++i) vstore(o + i * VW, acc[i]);
}

template <int T>
static void decode(const float* q, const void* kp, const void* vp, const int32_t* table,
                   int64_t stride, const int64_t* rows, const int64_t* seq_lens, int64_t B,
                   int64_t H, int64_t KVH, int64_t D, float scale, float* o) {
  const int64_t group = H / KVH;
#pragma omp parallel
  {
    std::vector<float> s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < B * H; ++t) {
      const int64_t b = t / H, h = t % H;
      decode_head<T>(q + t * D, kp, vp, table + rows[b] * stride, seq_lens[b], h / group, KVH, D,
                     scale, o + t * D, s);
    }
  }
}

extern "C" int rl_decode_attention(const float* q, const void* kp, const void* vp, int kvtype,
                                   const int32_t* table, int64_t stride, const int64_t* rows,
                                   const int64_t* seq_lens, int64_t B, int64_t H, int64_t KVH,
                                   int64_t D, float scale, float* o) {
  if (D % VW || D > 16 * VW || H % KVH) return -2;
  switch (kvtype) {
    case W_F32: decode<W_F32>(q, kp, vp, table, stride, rows, seq_lens, B, H, KVH, D, scale, o); return 0;
    case W_F16: decode<W_F16>(q, kp, vp, table, stride, rows, seq_lens, B, H, KVH, D, scale, o); return 0;
    case W_BF16: decode<W_BF16>(q, kp, vp, table, stride, rows, seq_lens, B, H, KVH, D, scale, o); return 0;
  }
  return -1;
}
