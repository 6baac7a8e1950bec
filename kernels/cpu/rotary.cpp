// radixlm CPU kernel: rotary embedding of an extend's q and k in place (fp32), replacing the ~14
// torch operators per layer of the reference (gathers, muls, cat: a third of a 1024-token
// prefill's host time). Row t of q [T, H * D] (row stride ldq) and of k [T, KVH * D] (ldk) rotates
// at position pos[t] with the tables cos / sin [max_pos, half] (see rotary.h).
#include <omp.h>

#include "rotary.h"

extern "C" int rl_rotary(float* q, int64_t ldq, int64_t H, float* k, int64_t ldk, int64_t KVH,
                         int64_t D, int64_t half, const int64_t* pos, int64_t T, const float* cos,
                         const float* sin) {
  if (2 * half > D) return -2;
#pragma omp parallel for schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + pos[t] * half;
    const float* s = sin + pos[t] * half;
    for (int64_t h = 0; h < H; ++h) rotate(q + t * ldq + h * D, c, s, half);
    for (int64_t h = 0; h < KVH; ++h) rotate(k + t * ldk + h * D, c, s, half);
  }
  return 0;
}
