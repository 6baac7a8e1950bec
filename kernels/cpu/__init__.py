"""CPU kernels (C++/SIMD through ctypes), each next to a torch reference of the same math.

Modules:
    build    compile the C++ sources once per machine (AVX2 or AVX-512 build, picked at run time)
             into a cache folder and load it; None (one log line) where it cannot
    linear   linear layers (GEMV at batch 1, tiled GEMM beyond; batch-invariant) over
             fp32/fp16/bf16 and GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 (on Q8 activations) and K-quant
             weights, block de-quantisation, and their torch references (`*_ref`)
    kquants  torch references of the K-quant super-blocks (Q4_K/Q5_K/Q6_K; kernels: kquants.h)
    attention  decode attention over the paged KV pool (through req_to_token), + reference
    norm     RMSNorm with the residual add before it (fp32), + reference
    activation  silu(gate) * up of a gate_up output (the decode step's element function)
    decode   a whole decode step of a Llama-family decoder in one call (`decode.cpp`), + reference
    sample   one draw per row: softmax, top-k / top-p / min-p, inverse CDF (`sample.cpp`), + reference
C++: linear_simd.h (vector helpers), gemv.h (row kernels, block layouts, batch invariance),
q8dot.h (32-value blocks on Q8 activations), kquants.h (K-quant super-blocks), attention.h (one
query's attention), activation.h (silu * mul), then one .cpp per C ABI.
Imports only torch (and numpy nowhere): `kernels/` stays dependency-free.
"""
