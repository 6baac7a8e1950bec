// radixlm CPU kernel: one whole decode step of a Llama-family decoder (Llama, Mistral without a
// window, Qwen2, SmolLM) in one call, for B requests of one new token each.
//
// Per layer, exactly the math of runtime/models/llama.py (fp32 activations throughout):
//   res += h (from layer 1 on); xn = RMSNorm(res)                          [input_layernorm]
//   qkv = xn Wqkv^T (+ bias); rotary (rotate-half) on q and k at pos[b]; k, v -> the pool at loc[b]
//   o = attention of q over the request's slots req_to_token[rows[b], :lens[b]] (GQA)
//   res += o Wo^T; xn = RMSNorm(res)                                       [post_attention_layernorm]
//   h = (silu(xn Wg^T) * (xn Wu^T)) Wd^T
// then out = RMSNorm(res + h) (the final norm): [B, hidden] fp32, the LM head's input.
//
// Weights (`RlLinear`) are up to 4 parts stacked along the output rows, each dense (fp32, fp16,
// bf16) or GGUF blocks (gemv.h): a layer's rows are split between the threads, which run the
// row kernels of gemv.h on them. Why one call: a torch-driven step costs ~4,000 dispatcher
// operators (views, casts, rotary, KV store, silu, residual adds) plus a Python frame per module,
// more time than the weights' arithmetic at batch 1.
//
// Threads: one OpenMP region per step (one futex wake-up, not one per layer); the 8 phases of a
// layer are split into chunks the threads claim (`Phases`): no thread waits for another to
// arrive, only for chunks to finish, so a loaded machine that deschedules a thread costs little.
#include <sched.h>

#include <algorithm>
#include <atomic>

#include "activation.h"
#include "attention.h"
#include "gemv.h"
#include "rotary.h"

struct RlLinear {
  int64_t K, N;       // inputs, outputs (the parts' rows summed)
  const float* bias;  // [N] fp32, or null
  int32_t nparts;
  int32_t kind[4];  // 0: dense (type = W_F32 / W_F16 / W_BF16), 1: GGUF blocks (type = ggml id)
  int32_t type[4];
  int64_t rows[4];
  const void* w[4];
};

struct RlLayer {
  RlLinear qkv, o, gate_up, down;  // gate_up: gate rows [0, I), up rows [I, 2I)
  const float* in_norm;            // [hidden] fp32
  const float* post_norm;
  void* k_pool;  // [slots, kv_heads, head_dim] of kv_type
  void* v_pool;
};

struct RlModel {
  int64_t n_layers, hidden, heads, kv_heads, head_dim, inter;
  float eps, scale;
  int32_t kv_type, emb_type;  // W_F32 / W_F16 / W_BF16
  const void* emb;            // [vocab, hidden]
  const float* final_norm;
  const float* cos;  // [max_pos, head_dim / 2] fp32
  const float* sin;
  const int32_t* table;  // req_to_token [rows, table_stride]
  int64_t table_stride;
  const RlLayer* layers;
};

// The step's phases run in order; each is split into chunks that the threads claim from a counter
// and count as done. A thread finishing a phase waits (spinning, then yielding) until every chunk
// of it is done, not until every thread has arrived: a thread the OS has descheduled (a loaded
// machine) holds up the others only while it holds an unfinished chunk, and when it comes back
// the phases done without it are skipped in a few loads.
struct alignas(64) PhaseCount {
  std::atomic<int64_t> claimed{0};
  std::atomic<int64_t> done{0};
};

struct Phases {
  PhaseCount* counts;
  int64_t next = 0;  // this thread's next phase

  template <class F>
  void run(int64_t chunks, F&& f) {
    PhaseCount& c = counts[next++];
    for (int64_t i; (i = c.claimed.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      f(i);
      c.done.fetch_add(1, std::memory_order_release);
    }
    for (int spin = 0; c.done.load(std::memory_order_acquire) < chunks; ++spin) {
      if (spin < 2048)
        _mm_pause();
      else
        sched_yield();
    }
  }
};

// NOTE: a multiple of PACK_ROWS: a chunk of a packed part is whole groups (decode.py checks the
// parts start on a group).
static constexpr int64_t ROWS_PER_CHUNK = 32;  // weight rows per claimed chunk of a linear
static constexpr int64_t PHASES_PER_LAYER = 8;

static bool linear_needs(const RlLinear& L, bool (*pred)(int)) {
  for (int p = 0; p < L.nparts; ++p)
    if (L.kind[p] == 1 && pred(L.type[p])) return true;
  return false;
}

// Output rows [n0, n1) of linear L for x [M, K] (in the forms its parts read): y[m * ldy + n]
// (+ bias).
static void linear_rows(const RlLinear& L, const XForms& x, int64_t M, int64_t n0, int64_t n1,
                        float* y, int64_t ldy) {
  int64_t base = 0;
  for (int p = 0; p < L.nparts; ++p) {
    const int64_t a = std::max(n0, base), b = std::min(n1, base + L.rows[p]);
    if (a < b) {
      if (L.kind[p] == 0)
        dense_rows_any(L.type[p], x.x, M, L.K, L.w[p], a - base, b - base, y + base, ldy);
      else
        quant_rows(L.type[p], x, M, L.K, (const uint8_t*)L.w[p], a - base, b - base, y + base,
                   ldy);
    }
    base += L.rows[p];
  }
  if (L.bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) y[m * ldy + n] += L.bias[n];
}

// x in the forms L's parts read (its per-32 sums, its Q8 form), in this thread's buffer.
static XForms forms_of(const RlLinear& L, const float* x, int64_t M, XBuf& buf) {
  return buf.prepare(x, M, L.K, linear_needs(L, needs_xsum), linear_needs(L, reads_q8));
}

// out = w * (h / sqrt(mean(h^2) + eps)) of one row h [D].
static inline void rms_row(const float* h, const float* w, float eps, int64_t D, float* out) {
  vf acc = vzero();
  for (int64_t d = 0; d < D; d += VW) acc = vfma(vload(h + d), vload(h + d), acc);
  const vf r = vset1(1.0f / sqrtf(vsum(acc) / (float)D + eps));
  for (int64_t d = 0; d < D; d += VW) vstore(out + d, vmul(vload(w + d), vmul(vload(h + d), r)));
}

static inline void add_row(float* res, const float* h, int64_t D) {
  for (int64_t d = 0; d < D; d += VW) vstore(res + d, vfma(vset1(1.0f), vload(h + d), vload(res + d)));
}

static inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1);  // round to nearest even, as torch's .to(bfloat16)
  return (uint16_t)(u >> 16);
}

static inline void store_row(void* pool, int type, int64_t off, const float* x, int64_t n) {
  if (type == W_F32) {
    memcpy((float*)pool + off, x, n * sizeof(float));
  } else if (type == W_F16) {
    for (int64_t i = 0; i < n; ++i) ((uint16_t*)pool)[off + i] = _cvtss_sh(x[i], 0);
  } else {
    for (int64_t i = 0; i < n; ++i) ((uint16_t*)pool)[off + i] = float_to_bf16(x[i]);
  }
}

static inline void load_row(const void* w, int type, int64_t off, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = type == W_F32    ? ((const float*)w)[off + i]
           : type == W_F16 ? half_to_float(((const uint16_t*)w)[off + i])
                           : bf16_to_float(((const uint16_t*)w)[off + i]);
}

static void attend(const RlModel& m, const RlLayer& L, const float* q, int64_t b, int64_t h,
                   const int64_t* rows, const int64_t* lens, float* o, std::vector<float>& s) {
  const int32_t* slots = m.table + rows[b] * m.table_stride;
  const int64_t kvh = h / (m.heads / m.kv_heads);
  switch (m.kv_type) {
    case W_F32:
      decode_head<W_F32>(q, L.k_pool, L.v_pool, slots, lens[b], kvh, m.kv_heads, m.head_dim,
                         m.scale, o, s);
      return;
    case W_F16:
      decode_head<W_F16>(q, L.k_pool, L.v_pool, slots, lens[b], kvh, m.kv_heads, m.head_dim,
                         m.scale, o, s);
      return;
    default:
      decode_head<W_BF16>(q, L.k_pool, L.v_pool, slots, lens[b], kvh, m.kv_heads, m.head_dim,
                          m.scale, o, s);
  }
}

// Rows of linear L for x [M, K] into y (ldy), in chunks of ROWS_PER_CHUNK claimed by the threads.
static void linear_phase(Phases& ph, const RlLinear& L, const float* x, int64_t M, float* y,
                         int64_t ldy, XBuf& buf) {
  XForms xf{};
  bool have = false;
  ph.run((L.N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK, [&](int64_t c) {
    if (!have) xf = forms_of(L, x, M, buf), have = true;  // NOTE: per thread, once per phase
    linear_rows(L, xf, M, c * ROWS_PER_CHUNK, std::min(L.N, (c + 1) * ROWS_PER_CHUNK), y, ldy);
  });
}

static void step(const RlModel& m, const int64_t* ids, const int64_t* pos, const int64_t* loc,
                 const int64_t* rows, const int64_t* lens, int64_t B, float* out, float* buf,
                 Phases ph) {
  const int64_t D = m.hidden, H = m.heads, KVH = m.kv_heads, Dh = m.head_dim, I = m.inter;
  const int64_t qn = H * Dh, kvn = KVH * Dh, nqkv = qn + 2 * kvn, half = Dh / 2;
  float* res = buf;             // [B, D] the residual stream
  float* xn = res + B * D;      // [B, D] normed input of a linear
  float* h = xn + B * D;        // [B, D] a sub-layer's output
  float* qkv = h + B * D;       // [B, nqkv]
  float* ao = qkv + B * nqkv;   // [B, qn] attention output
  float* gu = ao + B * qn;      // [B, 2I]
  float* act = gu + B * 2 * I;  // [B, I]
  XBuf xs;
  std::vector<float> sc;
  ph.run(B, [&](int64_t b) { load_row(m.emb, m.emb_type, ids[b] * D, res + b * D, D); });
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const RlLayer& L = m.layers[l];
    ph.run(B, [&](int64_t b) {
      if (l > 0) add_row(res + b * D, h + b * D, D);
      rms_row(res + b * D, L.in_norm, m.eps, D, xn + b * D);
    });
    linear_phase(ph, L.qkv, xn, B, qkv, nqkv, xs);
    ph.run(B, [&](int64_t b) {  // rotary on q and k, then k and v into the pool
      const float* c = m.cos + pos[b] * half;
      const float* s = m.sin + pos[b] * half;
      float* row = qkv + b * nqkv;
      for (int64_t j = 0; j < H + KVH; ++j) rotate(row + j * Dh, c, s, half);  // q then k heads
      for (int64_t kh = 0; kh < KVH; ++kh) {
        const int64_t off = (loc[b] * KVH + kh) * Dh;
        store_row(L.k_pool, m.kv_type, off, row + qn + kh * Dh, Dh);
        store_row(L.v_pool, m.kv_type, off, row + qn + kvn + kh * Dh, Dh);
      }
    });
    ph.run(B * H, [&](int64_t t) {
      const int64_t b = t / H, hh = t % H;
      attend(m, L, qkv + b * nqkv + hh * Dh, b, hh, rows, lens, ao + t * Dh, sc);
    });
    linear_phase(ph, L.o, ao, B, h, D, xs);
    ph.run(B, [&](int64_t b) {
      add_row(res + b * D, h + b * D, D);
      rms_row(res + b * D, L.post_norm, m.eps, D, xn + b * D);
    });
    // gate row i and up row I + i in one chunk: silu(g) * u stays within the chunk
    XForms gx{};
    bool have = false;
    ph.run((I + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK, [&](int64_t c) {
      if (!have) gx = forms_of(L.gate_up, xn, B, xs), have = true;
      const int64_t i0 = c * ROWS_PER_CHUNK, i1 = std::min(I, i0 + ROWS_PER_CHUNK);
      linear_rows(L.gate_up, gx, B, i0, i1, gu, 2 * I);
      linear_rows(L.gate_up, gx, B, I + i0, I + i1, gu, 2 * I);
      for (int64_t b = 0; b < B; ++b)
        silu_mul_row(gu + b * 2 * I + i0, gu + b * 2 * I + I + i0, i1 - i0, act + b * I + i0);
    });
    linear_phase(ph, L.down, act, B, h, D, xs);
  }
  ph.run(B, [&](int64_t b) {
    add_row(res + b * D, h + b * D, D);
    rms_row(res + b * D, m.final_norm, m.eps, D, out + b * D);
  });
}

extern "C" {

// Floats of scratch `rl_decode_step` needs for B requests.
int64_t rl_decode_scratch(const RlModel* m, int64_t B) {
  const int64_t qn = m->heads * m->head_dim, kvn = m->kv_heads * m->head_dim;
  return B * (3 * m->hidden + qn + 2 * kvn + qn + 3 * m->inter);
}

// out [B, hidden] fp32 = the final-normed hidden state after one decode step of B requests (token
// ids[b] at position pos[b], its K/V stored at slot loc[b], attending over
// table[rows[b], :lens[b]]). buf: rl_decode_scratch floats. Returns 0, or -2 for a shape the
// kernels do not take (checked again by the Python side before it builds the model).
int rl_decode_step(const RlModel* m, const int64_t* ids, const int64_t* pos, const int64_t* loc,
                   const int64_t* rows, const int64_t* lens, int64_t B, float* out, float* buf) {
  if (m->hidden % VW || m->head_dim % VW || m->head_dim > 16 * VW || m->heads % m->kv_heads)
    return -2;
  const int64_t n_phases = 2 + PHASES_PER_LAYER * m->n_layers;
  std::vector<PhaseCount> counts(n_phases);
#pragma omp parallel
  step(*m, ids, pos, loc, rows, lens, B, out, buf, Phases{counts.data()});
  return 0;
}
}
