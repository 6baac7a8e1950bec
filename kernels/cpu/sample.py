"""Drawing tokens on CPU (`sample.cpp`): softmax(logits / T), top-k, top-p, min-p and one inverse
CDF draw per row, in one call, fp32.

`sample_rows(logits, rows, temperature, top_k, top_p, min_p, uniforms)` draws one token for each
of `rows` of `logits [B, V]` with the uniform `uniforms[i]` in [0, 1) (the caller's generator, so a
seeded request draws the same token whatever shares its batch). Returns the tokens `[n]` int64, or
None where the kernel cannot run (library missing, another dtype or layout, a row whose every
logit is -inf): the caller keeps torch's path. `sample_rows_ref` is the same math in torch.

Torch's own ops cost ~3 ms per 49k-token row on a 2-core CPU (exponential noise 1 ms, the sort
behind top-p 1.75 ms); the kernel ~30 us, ~40 us with filters (the default model's logits).
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu.linear import _lib


def sample_rows(
    logits: torch.Tensor,
    rows: list[int],
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    min_p: list[float],
    uniforms: list[float],
) -> torch.Tensor | None:
    lib = _lib()
    if lib is None or logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        return None
    n = len(rows)
    vocab = logits.shape[1]
    out = torch.empty(n, dtype=torch.int64)
    args = (
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(temperature, dtype=torch.float32),
        torch.tensor([min(k, vocab) for k in top_k], dtype=torch.int64),
        torch.tensor(top_p, dtype=torch.float32),
        torch.tensor(min_p, dtype=torch.float32),
        torch.tensor(uniforms, dtype=torch.float64),
    )
    rc = lib.rl_sample_rows(
        logits.data_ptr(), logits.stride(0), vocab, n, *(a.data_ptr() for a in args),
        out.data_ptr(),
    )  # fmt: skip
    assert rc in (0, -1)
    return out


def sample_rows_ref(
    logits: torch.Tensor,
    rows: list[int],
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    min_p: list[float],
) -> torch.Tensor:
    """The probabilities `sample_rows` draws from, `[n, V]` float64: sampler.py's filters (every
    filter on the sorted probabilities of the whole row), renormalised."""
    out = []
    for i, row in enumerate(rows):
        p = torch.softmax(logits[row].double() / temperature[i], dim=-1)
        sorted_p, order = p.sort(descending=True, stable=True)
        before = sorted_p.cumsum(0) - sorted_p
        drop = torch.arange(p.numel()) >= top_k[i]
        if top_p[i] < 1.0:
            drop |= before > top_p[i]
        drop |= sorted_p < sorted_p[0] * min_p[i]
        kept = torch.zeros_like(p).scatter_(0, order, sorted_p.masked_fill(drop, 0.0))
        out.append(kept / kept.sum())
    return torch.stack(out)
