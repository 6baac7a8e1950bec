// radixlm CPU kernel: decode attention over the paged KV pool (one query token per request).
//
// Compiled into the same library as linear.cpp (kernels/cpu/build.py), with its vector helpers.
// Inputs: q [B, H, D] fp32; the pool's K and V [S, KVH, D] (fp32, fp16 or bf16); req_to_token
// [R, C] int32 (a request's positions -> slots); rows [B] and seq_lens [B] int64. Output o [B, H, D]
// fp32. Head h attends with KV head h / (H / KVH) (GQA): query b over the first seq_lens[b] slots
// of its table row (a decode batch: one query per request; an extend: each new token over its
// causal prefix, consecutive tokens of one request sharing K/V loads). Scores, a softmax and the
// weighted sum of V per query (attention.h); K/V rows are read straight from the pool through the
// table (no gather copy, no padding to the longest request).
#include "attention.h"

static constexpr int64_t Q_RUN = 16;  // consecutive tokens of one request attended as a block

// Tasks: runs of <= Q_RUN consecutive tokens of one request (an extend's new tokens; a decode
// batch has runs of 1) x KV heads; a task's queries (the run's tokens x the KV head's query
// heads) share K/V loads (attention.h's attend_block, bitwise decode_head per query).
template <int T>
static void decode(const float* q, const void* kp, const void* vp, const int32_t* table,
                   int64_t stride, const int64_t* rows, const int64_t* seq_lens, int64_t B,
                   int64_t H, int64_t KVH, int64_t D, float scale, float* o) {
  const int64_t group = H / KVH;
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < B; ++b)
    if (b == 0 || rows[b] != rows[b - 1] || b - starts.back() == Q_RUN) starts.push_back(b);
  const int64_t runs = (int64_t)starts.size();
  starts.push_back(B);
#pragma omp parallel
  {
    std::vector<std::vector<float>> s(Q_RUN * group);
    std::vector<const float*> qs(Q_RUN * group);
    std::vector<float*> os(Q_RUN * group);
    std::vector<int64_t> Ls(Q_RUN * group);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < runs * KVH; ++task) {
      const int64_t r = task / KVH, kvh = task % KVH;
      int64_t nq = 0;
      for (int64_t b = starts[r]; b < starts[r + 1]; ++b)
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h, ++nq) {
          qs[nq] = q + (b * H + h) * D;
          os[nq] = o + (b * H + h) * D;
          Ls[nq] = seq_lens[b];
        }
      attend_block<T>(qs.data(), Ls.data(), nq, kp, vp, table + rows[starts[r]] * stride, kvh,
                      KVH, D, scale, os.data(), s.data());
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
