// radixlm CPU kernel: RMSNorm, optionally after the residual add (HF Llama's semantics), fp32.
//
// Per row of x [M, D]: if `residual`: h = x + residual, written to `res_out` (the next residual);
// else h = x. out = w * (h * 1 / sqrt(mean(h^2) + eps)). One call replaces the ~9 torch operators
// of the reference (add, pow, mean, add, rsqrt, mul, mul, casts), which dominate a CPU decode
// step's host overhead (61 norms per step on a 30-layer model).
#include <math.h>

#include "linear_simd.h"

extern "C" int rl_rmsnorm(const float* x, const float* residual, const float* w, float eps,
                          int64_t M, int64_t D, float* out, float* res_out) {
  if (D % VW) return -2;
#pragma omp parallel for schedule(static) if (M > 16)
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * D;
    float* om = out + m * D;
    const float* h = xm;
    if (residual) {
      float* rm = res_out + m * D;
      for (int64_t d = 0; d < D; d += VW) vstore(rm + d, vfma(vset1(1.0f), vload(xm + d), vload(residual + m * D + d)));
      h = rm;
    }
    vf acc = vzero();
    for (int64_t d = 0; d < D; d += VW) acc = vfma(vload(h + d), vload(h + d), acc);
    const float r = 1.0f / sqrtf(vsum(acc) / (float)D + eps);
    const vf rv = vset1(r);
    for (int64_t d = 0; d < D; d += VW) vstore(om + d, vmul(vload(w + d), vmul(vload(h + d), rv)));
  }
  return 0;
}
