"""Helpers shared by the sections of `radixlm bench gpu`: the results being collected, logging,
the copy-bandwidth probe, random prompts, a dummy-weight engine, and the bytes a decode step
reads."""

from __future__ import annotations

import random
import time
from typing import Any

# Section name -> its results; `radixlm bench gpu` prints and writes this (--json).
RESULTS: dict[str, Any] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth (GB/s, read + write), the roofline's memory rate."""
    import torch
    from triton.testing import do_bench

    n = 1 << 30  # 4 GiB of fp32 read + 4 GiB written per copy
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    src = dst = None  # free before the engines start
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(count)]


def engine(model: str, **kwargs: Any) -> Any:
    from radixlm.runtime.frontend.engine import Engine

    return Engine(
        model_path=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        log_level="warning",
        **kwargs,
    )


def linear_params_per_layer(cfg: Any, batch: int = 1) -> int:
    """Weights of one decoder layer's linears a decode step of `batch` tokens reads: qkv, o,
    gate_up and down (a mixture of experts: the router and the experts the batch routes to, on
    average E * (1 - (1 - k / E) ** batch) of them for uniform routing: k at batch 1, nearly all
    at a large batch; Qwen2-MoE's shared expert too)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    attn = (cfg.q_size + 2 * cfg.kv_size) * h + cfg.q_size * h
    if getattr(cfg, "num_experts", 0):
        e, k = cfg.num_experts, cfg.num_experts_per_tok
        touched = k if batch <= 1 else e * (1 - (1 - k / e) ** batch)
        sparse = sum(cfg.moe_layers) / cfg.num_hidden_layers
        s_i = getattr(cfg, "shared_expert_intermediate_size", 0)
        shared = 3 * s_i * h + h if s_i else 0  # the shared expert and its gate
        moe = e * h + touched * 3 * cfg.moe_intermediate_size * h + shared
        return attn + round(sparse * moe + (1 - sparse) * 3 * i * h)
    return attn + 3 * i * h


def weight_bytes(cfg: Any, dtype_bytes: int = 2, linear_bytes: int = 2, batch: int = 1) -> int:
    """Bytes a decode step of `batch` tokens reads: decoder linears at `linear_bytes` per weight
    (1 with `quantization="fp8"`), norms and the LM head at `dtype_bytes`."""
    h = cfg.hidden_size
    head = cfg.vocab_size * h  # lm_head (the embedding lookup reads only a few rows)
    layers = cfg.num_hidden_layers
    linears = layers * linear_params_per_layer(cfg, batch) * linear_bytes
    return linears + (layers * 2 * h + h + head) * dtype_bytes


def kv_bytes_per_token(cfg: Any, dtype_bytes: int = 2) -> int:
    return 2 * cfg.num_hidden_layers * cfg.kv_size * dtype_bytes
