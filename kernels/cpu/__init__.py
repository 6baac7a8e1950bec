"""CPU kernels (C++/SIMD through ctypes), each next to a torch reference of the same math.

Modules:
    build    compile `linear.cpp` once per machine (AVX2 or AVX-512 build, picked at run time)
             into a cache folder and load it; None (one log line) where it cannot
    linear   small-batch linear layers over fp32/fp16/bf16 and GGUF Q8_0/Q4_0/Q4_1 weights, block
             de-quantisation for the GEMM path, and their torch references (`*_ref`)
    kquants  torch references of the K-quant super-blocks (Q4_K/Q5_K/Q6_K; kernels: kquants.h)
    attention  decode attention over the paged KV pool (through req_to_token), + reference
    norm     RMSNorm with the residual add before it (fp32), + reference
Imports only torch (and numpy nowhere): `kernels/` stays dependency-free.
"""
