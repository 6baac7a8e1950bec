"""Attention backends by name (`--attention-backend`): classes implementing `base.AttentionBackend`,
constructed by the model runner as `cls(kv_pool, req_to_token, num_heads, num_kv_heads,
head_dim)`. `ServerArgs` checks the name and picks the default (triton on CUDA, torch elsewhere)."""

from __future__ import annotations

from radixlm.runtime.registry import Registry

ATTENTION_BACKENDS: Registry[type] = Registry("attention backend")
ATTENTION_BACKENDS.register("torch", "radixlm.runtime.attention.torch_backend:TorchAttnBackend")
ATTENTION_BACKENDS.register("triton", "radixlm.runtime.attention.triton_backend:TritonAttnBackend")
