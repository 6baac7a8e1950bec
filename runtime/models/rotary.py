"""Rotary position embeddings (rotate-half / NeoX layout, as Hugging Face Llama), with Llama-3 and
linear scaling (or a GGUF's per-dim frequency divisors, llama.cpp's `rope_freqs`), over each head's first `config.rotary_dim` dims (all of them unless the config has
a `partial_rotary_factor`; the other dims pass through, as in transformers). The cos/sin table is built once per model with exactly HF's float32 arithmetic, so
cached lookups equal HF's on-the-fly values bit for bit."""

from __future__ import annotations

import math

import torch

from radixlm.runtime.models.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.rotary_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "freq_factors":  # llama.cpp's `rope_freqs` (a GGUF's Llama 3 scaling)
        divisors = torch.tensor(scaling["freq_factors"], dtype=torch.float32)
        if divisors.shape != inv_freq.shape:
            raise ValueError(f"{divisors.shape[0]} rope freq factors for {dim} rotary dims")
        inv_freq = inv_freq / divisors
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(torch.nn.Module):
    """Applies rotary embeddings to q `[T, H, D]` and k `[T, kvH, D]` (or flattened `[T, H*D]`)
    at `positions` `[T]`; returns tensors of the input shapes."""

    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused: bool = False
    ) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.rotary_dim = config.rotary_dim
        self.fused = fused
        inv_freq = rope_inv_freq(config)
        pos = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = (pos[:, None] * inv_freq[None, :]).to(device)
        # NOTE: float32 table; gathered rows are cast to the activation dtype, as HF does.
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)
        if fused:  # the Triton kernel's layout: [max_pos, rotary_dim] = [cos | sin]
            self.register_buffer(
                "cos_sin", torch.cat([self.cos, self.sin], dim=-1), persistent=False
            )

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            from radixlm.kernels.rotary import rotary_embedding

            t, d = q.shape[0], self.head_dim
            rotary_embedding(positions, q.view(t, -1, d), k.view(t, -1, d), self.cos_sin)
            return q, k
        if q.device.type == "cpu" and q.dtype == torch.float32:
            from radixlm.kernels.cpu.rotary import rotary_inplace

            t = q.shape[0]  # NOTE: in place, as the fused kernel; same bits as the ops below
            if rotary_inplace(
                positions, q.view(t, -1), k.view(t, -1), self.cos, self.sin, self.head_dim
            ):
                return q, k
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)  # [T, 1, rotary_dim / 2]
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin, self.head_dim), _rotate(k, cos, sin, self.head_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    half = cos.shape[-1]
    heads = x.view(x.shape[0], -1, head_dim)
    x1, x2 = heads[..., :half], heads[..., half : 2 * half]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if 2 * half < head_dim:  # partial rotary: the remaining dims pass through
        parts.append(heads[..., 2 * half :])
    return torch.cat(parts, dim=-1).view(x.shape)
