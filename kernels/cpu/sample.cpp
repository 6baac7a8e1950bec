// radixlm CPU kernel: one draw per row from softmax(logits / T) after top-k, top-p and min-p, by
// inverse CDF with a uniform the caller draws from the row's own generator.
//
// Semantics of sampler.py's torch path (SGLang's): the filters read the probabilities of the
// whole row sorted in descending order (rank < top_k; the mass before a token <= top_p; p >=
// p_max * min_p) and the kept tokens are drawn in proportion to p. Per row:
//   1. e[v] = exp((l[v] - max l) / T) with activation.h's 8-lane exp (0 where l[v] = -inf: a
//      masked token is never drawn), summed per 64-token group in fp32 lanes, the groups in fp64;
//   2. no filter: the first token whose running sum passes u * sum (the groups first, then the
//      tokens of one group);
//   3. filters: the tokens with e >= theta (1e-3, then 1e-6, 1e-9), sorted (e descending,
//      token ascending), walked until a filter stops: the kept prefix, drawn like 2 in that
//      order. Where more than 4096 tokens pass theta before a filter stops (a flat row), e goes
//      into buckets by its fp32 bits (64 per octave), walked from the largest: a bucket no
//      filter can stop inside is kept whole, the first where one may is sorted and walked; the
//      kept tokens are drawn like 2 in token order. torch sorts the whole row instead.
// One thread per call (the scheduler's rows are few): no OpenMP barrier on a busy machine.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "activation.h"

namespace {

constexpr int64_t kGroup = 64;
constexpr int64_t kFirstMax = 4096;  // a filtered row's candidates: sorted up to this many

// e[v] for v < V, the per-group sums into gs, and the total (sum of the groups, in order).
double exp_row(const float* l, int64_t V, float m, float inv_t, float* e, double* gs) {
  const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  double total = 0.0;
  for (int64_t g0 = 0, g = 0; g0 < V; g0 += kGroup, ++g) {
    const int64_t g1 = std::min(V, g0 + kGroup);
    __m256 acc = _mm256_setzero_ps();
    int64_t v = g0;
    for (; v + 8 <= g1; v += 8) {
      const __m256 x = _mm256_loadu_ps(l + v);
      const __m256 y = vexp8(_mm256_mul_ps(_mm256_sub_ps(x, vm), vt));
      const __m256 kept = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), y);
      _mm256_storeu_ps(e + v, kept);
      acc = _mm256_add_ps(acc, kept);
    }
    if (v < g1) {  // the row's last, partial vector: lanes past V read 0 and are stored nowhere
      const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(g1 - v)),
                                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256 x = _mm256_maskload_ps(l + v, lanes);
      __m256 y = vexp8(_mm256_mul_ps(_mm256_sub_ps(x, vm), vt));
      y = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), y);
      y = _mm256_and_ps(_mm256_castsi256_ps(lanes), y);
      _mm256_maskstore_ps(e + v, lanes, y);
      acc = _mm256_add_ps(acc, y);
    }
    gs[g] = (double)hsum8(acc);
    total += gs[g];
  }
  return total;
}

// The first token of e[0, V) whose running sum passes `target` (groups of kGroup, sums gs).
int64_t pick_row(const float* e, const double* gs, int64_t V, double target) {
  const int64_t groups = (V + kGroup - 1) / kGroup;
  double acc = 0.0;
  int64_t g = 0;
  for (; g < groups - 1 && acc + gs[g] <= target; ++g) acc += gs[g];
  int64_t last = -1;
  for (int64_t v = g * kGroup; v < std::min(V, (g + 1) * kGroup); ++v) {
    if (e[v] > 0.0f) {
      last = v;
      acc += e[v];
      if (acc > target) return v;
    }
  }
  if (last >= 0) return last;  // the group's fp32 sum passed target, its tokens' fp64 sum not
  for (int64_t v = V - 1; v >= 0; --v)
    if (e[v] > 0.0f) return v;
  return -1;
}

float row_max(const float* l, int64_t V) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  int64_t v = 0;
  for (; v + 8 <= V; v += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(l + v));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = -INFINITY;
  for (float x : lanes) m = std::max(m, x);
  for (; v < V; ++v) m = std::max(m, l[v]);
  return m;
}

// Buckets of e by its fp32 bits: 64 per octave over [2^-40, 1] (e of the largest logit is exp(0)
// = 1 exactly), bucket 0 for everything below. The key is monotonic in e.
constexpr int kSub = 6, kLowExp = 127 - 40;
constexpr int kBuckets = (40 << kSub) + (1 << kSub) + 1;

inline int bucket_of(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  return std::max(0, (int)(bits >> (23 - kSub)) - (kLowExp << kSub) + 1);
}

using Cand = std::pair<float, int32_t>;  // (e, token)

// The tokens with e >= theta, in token order, into cand (8 compared at a time).
void collect(const float* e, int64_t V, float theta, std::vector<Cand>& cand) {
  cand.clear();
  const __m256 th = _mm256_set1_ps(theta);
  int64_t v = 0;
  for (; v + 8 <= V; v += 8) {
    for (int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(e + v), th, _CMP_GE_OQ));
         bits; bits &= bits - 1) {
      const int64_t t = v + __builtin_ctz(bits);
      cand.emplace_back(e[t], (int32_t)t);
    }
  }
  for (; v < V; ++v)
    if (e[v] >= theta) cand.emplace_back(e[v], (int32_t)v);
}

// Sorts `cand` in the filters' order (e descending, token ascending) and walks it from `rank`
// tokens and `mass` before it: the number of its tokens kept (rank and mass move past them).
int64_t walk_sorted(std::vector<Cand>& cand, int64_t top_k, double p_mass, float min_p,
                    int64_t& rank, double& mass) {
  std::sort(cand.begin(), cand.end(), [](const Cand& x, const Cand& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  int64_t j = 0;
  for (; j < (int64_t)cand.size(); ++j) {
    if (rank >= top_k || mass > p_mass || cand[j].first < min_p) break;
    ++rank;
    mass += cand[j].first;
  }
  return j;
}

// The first of cand[0, n) whose running sum passes target (the last one where rounding does not).
int64_t draw_sorted(const std::vector<Cand>& cand, int64_t n, double target) {
  double acc = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    acc += cand[r].first;
    if (acc > target) return cand[r].second;
  }
  return cand[n - 1].second;
}

// The kept tokens of a filtered row: every token of a bucket above `bucket`, and in `bucket` the
// first `n_last` of its tokens in the filters' order (e descending, token ascending), ending at
// `last`. `mass`: their sum.
struct Kept {
  int bucket = 0;
  int64_t n_last = 0;
  Cand last{0.0f, 0};
  double mass = 0.0;
  bool holds(float e, int32_t v) const {
    const int b = bucket_of(e);
    if (b != bucket) return b > bucket;
    return n_last > 0 && (e > last.first || (e == last.first && v <= last.second));
  }
};

// The filters over the buckets from the top: a bucket where no filter can stop is kept whole
// (its mass and count from one pass); the first one where one may is sorted and walked token by
// token. std::sort runs on that bucket only (1/64 of an octave).
Kept kept_tokens(const float* e, int64_t V, int64_t top_k, double p_mass, float min_p,
                 std::vector<int64_t>& count, std::vector<double>& mass, std::vector<Cand>& cand) {
  std::fill(count.begin(), count.end(), 0);
  std::fill(mass.begin(), mass.end(), 0.0);
  for (int64_t v = 0; v < V; ++v) {
    if (e[v] > 0.0f) {
      const int b = bucket_of(e[v]);
      ++count[b];
      mass[b] += e[v];
    }
  }
  Kept k;
  int64_t rank = 0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (count[b] == 0) continue;
    // NOTE: bucket b holds values from lo up to the next bucket's lo (1/64 of an octave above).
    uint32_t lo_bits = (uint32_t)(b - 1 + (kLowExp << kSub)) << (23 - kSub);
    float lo;
    memcpy(&lo, &lo_bits, 4);
    const bool may_stop = rank + count[b] > top_k || k.mass + mass[b] > p_mass ||
                          (min_p > 0.0f && (b == 0 || lo < min_p));
    if (!may_stop) {
      rank += count[b];
      k.mass += mass[b];
      k.bucket = b;
      k.n_last = count[b];
      k.last = {0.0f, INT32_MAX};  // the whole bucket: every e > 0 holds
      continue;
    }
    cand.clear();
    for (int64_t v = 0; v < V; ++v)
      if (e[v] > 0.0f && bucket_of(e[v]) == b) cand.emplace_back(e[v], (int32_t)v);
    const int64_t j = walk_sorted(cand, top_k, p_mass, min_p, rank, k.mass);
    if (j > 0) k = Kept{b, j, cand[j - 1], k.mass};
    if (j < (int64_t)cand.size()) return k;
  }
  return k;
}

}  // namespace


// rows [n] index logits [*, ld] (fp32, V tokens a row); per i < n: temperature t[i] > 0, top_k[i]
// (>= V: off), top_p[i] (1: off), min_p[i] (0: off), u[i] in [0, 1). out[i]: the token. Returns
// 0, or -1 where a row has no token of positive probability (every logit -inf).
extern "C" int rl_sample_rows(const float* logits, int64_t ld, int64_t V, int64_t n,
                              const int64_t* rows, const float* t, const int64_t* top_k,
                              const float* top_p, const float* min_p, const double* u,
                              int64_t* out) {
  std::vector<float> e(V);
  std::vector<double> gs((V + kGroup - 1) / kGroup);
  std::vector<int64_t> count(kBuckets);
  std::vector<double> mass(kBuckets);
  std::vector<Cand> cand;
  int rc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* l = logits + rows[i] * ld;
    const float m = row_max(l, V);
    if (m == -INFINITY) {
      out[i] = -1;
      rc = -1;
      continue;
    }
    const double total = exp_row(l, V, m, 1.0f / t[i], e.data(), gs.data());
    if (top_k[i] >= V && top_p[i] >= 1.0f && min_p[i] <= 0.0f) {
      out[i] = pick_row(e.data(), gs.data(), V, u[i] * total);
      continue;
    }
    // Peaked rows (most): the tokens with e >= theta hold the kept ones once a filter stops
    // inside them (theta 1e-3, then 1e-6, 1e-9), drawn in sorted order; else the buckets.
    const double p_mass = top_p[i] < 1.0f ? (double)top_p[i] * total : INFINITY;
    bool drawn = false;
    for (float theta = 1e-3f; theta > 1e-10f && !drawn; theta *= 1e-3f) {
      collect(e.data(), V, theta, cand);
      if ((int64_t)cand.size() > kFirstMax) break;
      int64_t rank = 0;
      double kept_mass = 0.0;
      const int64_t j = walk_sorted(cand, top_k[i], p_mass, min_p[i], rank, kept_mass);
      if (j < (int64_t)cand.size() || min_p[i] >= theta) {
        out[i] = draw_sorted(cand, j, u[i] * kept_mass);
        drawn = true;
      }
    }
    if (drawn) continue;
    const Kept kept = kept_tokens(e.data(), V, top_k[i], p_mass, min_p[i], count, mass, cand);
    const double target = u[i] * kept.mass;
    double acc = 0.0;
    out[i] = -1;
    for (int64_t v = 0; v < V; ++v) {
      if (e[v] > 0.0f && kept.holds(e[v], (int32_t)v)) {
        out[i] = v;  // the last kept token, where rounding leaves target past the running sum
        acc += e[v];
        if (acc > target) break;
      }
    }
  }
  return rc;
}
