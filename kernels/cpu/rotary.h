// Rotary embedding (rotate-half, as HF Llama) of one head vector in place, fp32: with c / s the
// position's cos / sin rows of `half` values, x[j] = a c - b s and x[j + half] = b c + a s
// (a = x[j], b = x[j + half]); dims past 2 half pass through. Shared by decode.cpp (a decode
// step's rows) and rotary.cpp (an extend's): the same operations, so the same bits.
#pragma once
#include <stdint.h>

static inline void rotate(float* x, const float* c, const float* s, int64_t half) {
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j], b = x[j + half];
    x[j] = a * c[j] - b * s[j];
    x[j + half] = b * c[j] + a * s[j];
  }
}
