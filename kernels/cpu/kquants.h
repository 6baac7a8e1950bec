// GGUF K-quant super-blocks (llama.cpp's layouts, as `gguf.quants` de-quantises them): the dot
// of one super-block with 256 x values, and its de-quantisation. Included by linear.cpp, whose
// `quant_row_dot` / `dequant_rows` walk a row's super-blocks and call these.
//
// 256 values per super-block, 8 sub-blocks of 32 (Q4_K, Q5_K) or 16 groups of 16 (Q6_K):
//   Q4_K (144 B): fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]
//   Q5_K (176 B): fp16 d, fp16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]
//                 x = d * sc[s] * q - dmin * m[s]   (s = sub-block, 6-bit sc/m packed in scales)
//                 q of sub-block 2j / 2j+1: low / high nibbles of qs[32j .. 32j + 32]; Q5_K adds
//                 bit s of qh[l] as bit 4 of element l of sub-block s.
//   Q6_K (210 B): uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d
//                 x = d * scales[e / 16] * (q - 32), element e = 128 h + 32 c + l (c < 4):
//                 q = 4 bits of ql[64 h + 32 (c & 1) + l] (low for c < 2, else high)
//                   | bits 2c, 2c+1 of qh[32 h + l] as bits 4, 5.
// Q4_K/Q5_K's min term uses the per-32 sums of x (`xs`, computed once per call by linear.cpp):
// sum_l x_l (d sc q_l - dmin m) = d sc sum_l q_l x_l - dmin m xs.
#pragma once
#include "linear_simd.h"

static inline int kq_block_bytes(int q) { return q == Q4_K ? 144 : (q == Q5_K ? 176 : 210); }

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block.
static inline void kq_scale_min(const uint8_t* s, float* sc, float* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = (float)(s[j] & 63);
    mn[j] = (float)(s[j + 4] & 63);
    sc[j + 4] = (float)((s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30));
    mn[j + 4] = (float)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
  }
}

// Bit `s` of each qh byte, as 16 (0 or 16) to OR into the nibbles.
static inline __m128i q5_high_bit(__m128i qh, int s) {
  const __m128i bit = _mm_set1_epi8((char)(1 << s));
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(qh, bit), bit), _mm_set1_epi8(16));
}

// acc += sum over the super-block of q * x * (d sc); extra -= dmin m xs per sub-block.
template <int Q>
static inline void q45k_dot(const uint8_t* blk, const float* xb, const float* xs, vf& acc,
                            float& extra) {
  uint16_t dh, mh;
  memcpy(&dh, blk, 2);
  memcpy(&mh, blk + 2, 2);
  const float d = half_to_float(dh), dmin = half_to_float(mh);
  float sc[8], mn[8];
  kq_scale_min(blk + 4, sc, mn);
  const uint8_t* qs = blk + (Q == Q5_K ? 48 : 16);
  const __m128i low = _mm_set1_epi8(0x0F);
  __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
  if (Q == Q5_K) {
    h0 = _mm_loadu_si128((const __m128i*)(blk + 16));
    h1 = _mm_loadu_si128((const __m128i*)(blk + 32));
  }
  for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high) of qs[32j ..]
    __m128i b0 = _mm_loadu_si128((const __m128i*)(qs + 32 * j));
    __m128i b1 = _mm_loadu_si128((const __m128i*)(qs + 32 * j + 16));
    __m128i lo0 = _mm_and_si128(b0, low), hi0 = _mm_and_si128(_mm_srli_epi16(b0, 4), low);
    __m128i lo1 = _mm_and_si128(b1, low), hi1 = _mm_and_si128(_mm_srli_epi16(b1, 4), low);
    if (Q == Q5_K) {
      lo0 = _mm_or_si128(lo0, q5_high_bit(h0, 2 * j));
      lo1 = _mm_or_si128(lo1, q5_high_bit(h1, 2 * j));
      hi0 = _mm_or_si128(hi0, q5_high_bit(h0, 2 * j + 1));
      hi1 = _mm_or_si128(hi1, q5_high_bit(h1, 2 * j + 1));
    }
    const float* x = xb + 64 * j;
    vf pl = madd16_u8(lo1, x + 16, madd16_u8(lo0, x, vzero()));
    vf ph = madd16_u8(hi1, x + 48, madd16_u8(hi0, x + 32, vzero()));
    acc = vfma(pl, vset1(d * sc[2 * j]), acc);
    acc = vfma(ph, vset1(d * sc[2 * j + 1]), acc);
    extra -= dmin * mn[2 * j] * xs[2 * j] + dmin * mn[2 * j + 1] * xs[2 * j + 1];
  }
}

static inline void q6k_dot(const uint8_t* blk, const float* xb, vf& acc) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const int8_t* scales = (const int8_t*)(blk + 192);
  uint16_t dh;
  memcpy(&dh, blk + 208, 2);
  const float d = half_to_float(dh);
  const __m128i low = _mm_set1_epi8(0x0F), two = _mm_set1_epi8(3), bias = _mm_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      for (int t = 0; t < 2; ++t) {  // 16 elements: one scale group
        __m128i l = _mm_loadu_si128((const __m128i*)(ql + 64 * h + 32 * (c & 1) + 16 * t));
        l = _mm_and_si128(c < 2 ? l : _mm_srli_epi16(l, 4), low);
        __m128i u = _mm_loadu_si128((const __m128i*)(qh + 32 * h + 16 * t));
        u = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(u, 2 * c), two), 4);
        __m128i q = _mm_sub_epi8(_mm_or_si128(l, u), bias);  // -32 .. 31
        const int g = 8 * h + 2 * c + t;
        acc = vfma(madd16_i8(q, xb + 16 * g, vzero()), vset1(d * (float)scales[g]), acc);
      }
    }
  }
}

// out[0..255] = the super-block de-quantised (the same float ops as gguf.quants).
template <int Q>
static inline void kq_dequant(const uint8_t* blk, float* out) {
  if (Q == Q6_K) {
    uint16_t dh;
    memcpy(&dh, blk + 208, 2);
    const float d = half_to_float(dh);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, c = (e % 128) / 32, l = e % 32;
      const int lo = (blk[64 * h + 32 * (c & 1) + l] >> (c < 2 ? 0 : 4)) & 0x0F;
      const int hi = (blk[128 + 32 * h + l] >> (2 * c)) & 3;
      out[e] = d * (float)((const int8_t*)(blk + 192))[e / 16] * (float)((lo | (hi << 4)) - 32);
    }
    return;
  }
  uint16_t dh, mh;
  memcpy(&dh, blk, 2);
  memcpy(&mh, blk + 2, 2);
  const float d = half_to_float(dh), dmin = half_to_float(mh);
  float sc[8], mn[8];
  kq_scale_min(blk + 4, sc, mn);
  const uint8_t* qs = blk + (Q == Q5_K ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    const float ds = d * sc[s], dm = dmin * mn[s];
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 0x0F;
      if (Q == Q5_K) q |= ((blk[16 + l] >> s) & 1) << 4;
      out[32 * s + l] = ds * (float)q - dm;
    }
  }
}
