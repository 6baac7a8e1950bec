// radixlm CPU kernel: the gated MLP activation, out [M, I] = silu(gu[:, :I]) * gu[:, I:] for
// gu [M, 2I] fp32 (a gate_up linear's output), with activation.h's element function: the same
// numbers as the one-call decode step's MLP (decode.cpp).
#include "activation.h"

extern "C" int rl_silu_mul(const float* gu, int64_t M, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (M > 16)
  for (int64_t m = 0; m < M; ++m) silu_mul_row(gu + m * 2 * I, gu + m * 2 * I + I, I, out + m * I);
  return 0;
}
