// Decode attention of one (request, head) over the paged KV pool: shared by attention.cpp (one
// layer per call) and decode.cpp (a whole decode step per call). See attention.cpp's header for
// the layout.
#pragma once
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
