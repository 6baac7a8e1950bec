// Vector helpers shared by the CPU kernels (linear.cpp, attention.cpp): 16 fp32 lanes where the
// library is built with AVX-512 (__AVX512F__), else 8 (AVX2/FMA/F16C); weight/KV element loads
// for fp32, fp16 and bf16 (`load_w<T>`), widened to fp32.
#pragma once
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vset1(float a) { return _mm512_set1_ps(a); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline vf vload_bf16(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline vf vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline vf vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline void vstore(float* p, vf a) { _mm512_storeu_ps(p, a); }
#else
#define VW 8
typedef __m256 vf;
static inline vf vzero() { return _mm256_setzero_ps(); }
static inline vf vset1(float a) { return _mm256_set1_ps(a); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline vf vload_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline vf vload_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
static inline vf vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
#endif

// The sum of 8 fp32 lanes: (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)), the same in every build.
static inline float hsum8(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

enum WType { W_F32 = 0, W_F16 = 1, W_BF16 = 2 };
enum QType { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  // ggml ids

// acc + 16 byte values (unsigned / signed) of `q` times x[0..15], widened to fp32.
static inline vf madd16_u8(__m128i q, const float* x, vf acc) {
#if VW == 16
  return vfma(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), vload(x), acc);
#else
  acc = vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vload(x), acc);
  return vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), vload(x + 8), acc);
#endif
}
static inline vf madd16_i8(__m128i q, const float* x, vf acc) {
#if VW == 16
  return vfma(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), vload(x), acc);
#else
  acc = vfma(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vload(x), acc);
  return vfma(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), vload(x + 8), acc);
#endif
}

template <int T>
static inline vf load_w(const void* w, int64_t off) {
  if (T == W_F32) return vload((const float*)w + off);
  if (T == W_F16) return vload_f16((const uint16_t*)w + off);
  return vload_bf16((const uint16_t*)w + off);
}

template <int T>
static inline float scalar_w(const void* w, int64_t off) {
  if (T == W_F32) return ((const float*)w)[off];
  if (T == W_F16) return half_to_float(((const uint16_t*)w)[off]);
  return bf16_to_float(((const uint16_t*)w)[off]);
}

