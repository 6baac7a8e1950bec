"""Triton kernels, each next to a pure-torch reference of the same math.

Modules (import the one you need; this package imports nothing, so `radixlm.kernels.<x>` and its
`*_ref` functions work where Triton is missing):
    store_kv           write new K/V rows into the paged pool
    extend_attention   prefix (paged) + causal new-token attention
    decode_attention   split-KV, GQA-grouped decode attention (CUDA-graph-safe entry point);
                       its torch reference in decode_attention_ref
    decode_workspace   split-count heuristic and the fp32 workspace of decode attention
    token_bitmask      apply a packed allowed-token bitmask to logits
    token_bitmask_cpu  the same on CPU logits with numpy, one thread (the sampler's CPU path)
    rmsnorm            RMSNorm and fused residual-add + RMSNorm (HF Llama semantics)
    rotary             neox-style rotary embedding, in place (alone or fused with the K/V store)
    activation         Llama's MLP activation silu(gate) * up
    argmax             two-stage row argmax (greedy sampling)
    decode_inputs      a decode step's input columns and req_to_token entries, in one launch
    gemv               small-batch (decode) linear layer (+ gated activation), vs cuBLAS per shape
    quant_fp8          per-token FP8 quantisation of activations (the FP8 GEMM's input)
    testing            random paged batches and tolerances for tests/benchmarks
    cpu/               C++/SIMD CPU kernels (ctypes; built on first use): small-batch linears on
                       dense and GGUF-block weights, decode attention, RMSNorm (see cpu/__init__)
Their benchmark, `radixlm bench kernels`, lives in radixlm.bench.kernels (checks in
kernel_checks, speed sections in kernel_perf). See docs/kernels.md.
"""
