// radixlm CPU kernel: decode attention over the paged KV pool (one query token per request).
//
// Compiled into the same library as linear.cpp (kernels/cpu/build.py), with its vector helpers.
// Inputs: q [B, H, D] fp32; the pool's K and V [S, KVH, D] (fp32, fp16 or bf16); req_to_token
// [R, C] int32 (a request's positions -> slots); rows [B] and seq_lens [B] int64. Output o [B, H, D]
// fp32. Head h attends with KV head h / (H / KVH) (GQA). One OpenMP task per (request, head):
// scores over the request's L slots, a softmax, and the weighted sum of V; K/V rows are read
// straight from the pool through the table (no gather copy, no padding to the longest request).
#include "attention.h"

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
