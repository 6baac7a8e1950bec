"""Tree verify attention (Triton, split-KV over the prefix + the masked tree part) against its
torch reference and against a naive per-row softmax built from the parents (not the bitmask):
random trees and chains, GQA, several requests with different prefixes (0 included), windows,
soft caps, FP8 pools, padding requests; a chain equals ordinary causal attention."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.decode_workspace import alloc_decode_workspace
from radixlm.kernels.store_kv import dequantize_kv, quantize_kv
from radixlm.kernels.testing import assert_close, dense_attention_sdpa
from radixlm.kernels.verify_attention import verify_attention, verify_attention_fwd
from radixlm.kernels.verify_attention_ref import verify_attention_ref
from radixlm.runtime.speculative.tree import build_tree, chain_parents

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@dataclass
class VerifyBatch:
    q: torch.Tensor  # [B * N, H, D]
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    draft_loc: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor  # [B * N]
    parents: list[list[int]]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.q,
            self.k_buffer,
            self.v_buffer,
            self.req_to_token,
            self.req_pool_indices,
            self.prefix_lens,
            self.draft_loc,
            self.tree_mask,
            self.positions,
        )


def random_parents(rng: random.Random, n: int, size: int) -> list[int]:
    return [-1] + [rng.randrange(j) for j in range(1, size)] + [-1] * (n - size)


def make_verify_batch(
    prefix_lens: list[int],
    parents: list[list[int]],
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> VerifyBatch:
    """A paged verify batch laid out like the runtime's, every slot nobody owns (slot 0 too)
    poisoned with NaN: a kernel that reads one fails."""
    gen = torch.Generator().manual_seed(seed)
    bsz, n = len(prefix_lens), len(parents[0])
    sizes = [1 + sum(p >= 0 for p in row[1:]) for row in parents]
    total = sum(prefix_lens) + sum(sizes)
    num_slots = 1 + total + 7
    order = torch.randperm(num_slots - 1, generator=gen)[:total] + 1
    rows = torch.randperm(bsz + 3, generator=gen)[:bsz]
    k_buffer = torch.full((num_slots, kv_heads, dim), float("nan"))
    v_buffer = torch.full((num_slots, kv_heads, dim), float("nan"))
    table = torch.zeros(bsz + 3, max(prefix_lens) + n + 4, dtype=torch.int32)
    draft_loc = torch.zeros(bsz, n, dtype=torch.int64)
    used = 0
    for i, (pre, size) in enumerate(zip(prefix_lens, sizes)):
        slots = order[used : used + pre + size]
        used += pre + size
        table[rows[i], :pre] = slots[:pre].to(torch.int32)
        draft_loc[i, :size] = slots[pre:]
        for buf in (k_buffer, v_buffer):
            buf[slots] = torch.randn(pre + size, kv_heads, dim, generator=gen)
    q = torch.randn(bsz * n, heads, dim, generator=gen)
    prefix = torch.tensor(prefix_lens, dtype=torch.int64)
    tree = build_tree(torch.tensor(parents), prefix, check=True)
    return VerifyBatch(
        q.to(dtype).to(device),
        k_buffer.to(dtype).to(device),
        v_buffer.to(dtype).to(device),
        table.to(device),
        rows.to(device),
        prefix.to(device),
        draft_loc.to(device),
        tree.mask.to(device),
        tree.positions.reshape(-1).to(device),
        parents,
    )


def naive_verify(
    batch: VerifyBatch,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Row by row from the parents: node j of request i attends to the prefix and to the walk
    j -> root, each key at its position (prefix: 0..L-1, node a: L + depth(a)); fp32."""
    bsz, n = batch.draft_loc.shape
    heads, dim = batch.q.shape[1:]
    group = heads // batch.k_buffer.shape[1]
    scale = 1 / math.sqrt(dim) if scale is None else scale
    out = torch.zeros(bsz * n, heads, dim)
    for i in range(bsz):
        par = batch.parents[i]
        pre = int(batch.prefix_lens[i])
        prefix_slots = batch.req_to_token[batch.req_pool_indices[i], :pre].long().tolist()

        for j in range(n):
            walk = []
            if j == 0 or par[j] >= 0:
                a = j
                while True:
                    walk.append(a)
                    if a == 0:
                        break
                    a = par[a]
            keys = [(s, p) for p, s in enumerate(prefix_slots)]
            keys += [
                (int(batch.draft_loc[i, a]), pre + len(walk) - 1 - x) for x, a in enumerate(walk)
            ]
            q_pos = pre + max(0, len(walk) - 1)
            if window is not None:
                keys = [(s, p) for s, p in keys if p > q_pos - window]
            if not keys:
                continue
            idx = torch.tensor([s for s, _ in keys], device=batch.k_buffer.device)
            k = dequantize_kv(batch.k_buffer[idx], torch.float32, k_scale).cpu()
            v = dequantize_kv(batch.v_buffer[idx], torch.float32, v_scale).cpu()
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [S, H, D]
            s = torch.einsum("hd,shd->hs", batch.q[i * n + j].float().cpu(), k) * scale
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            out[i * n + j] = torch.einsum("hs,shd->hd", torch.softmax(s, -1), v)
    return out


PREFIXES = [0, 37, 5, 70]


@needs_triton
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "dtype", "nodes", "splits"),
    [
        (4, 4, 32, torch.float32, 8, None),  # MHA, heuristic splits
        (8, 2, 64, torch.float16, 16, 3),  # GQA 4
        (8, 1, 40, torch.bfloat16, 5, 4),  # GQA 8, head_dim not a power of two
        (4, 2, 32, torch.float32, 33, 2),  # two mask words (bit 31 = the int32 sign bit)
        (2, 1, 32, torch.float32, 64, 1),  # the largest tree: two row blocks, one split
    ],
)
def test_verify_matches_reference_and_naive(
    device: str,
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype,
    nodes: int,
    splits: int | None,
) -> None:
    rng = random.Random(nodes)
    sizes = [nodes, 1, rng.randint(1, nodes), max(1, nodes // 2)]
    parents = [random_parents(rng, nodes, s) for s in sizes]
    batch = make_verify_batch(PREFIXES, parents, heads, kv_heads, dim, dtype, device, seed=nodes)
    out = torch.full_like(batch.q, float("nan"))
    verify_attention(*batch.args(), num_kv_splits=splits, out=out)
    expected = verify_attention_ref(*batch.args())
    assert_close(out, expected, dtype, "verify attention vs reference")
    naive = naive_verify(batch).to(dtype)
    assert_close(expected.cpu(), naive, dtype, "reference vs naive")
    assert_close(out.cpu(), naive, dtype, "verify attention vs naive")


@needs_triton
@pytest.mark.parametrize("splits", [1, 3])
def test_chain_equals_causal_attention(device: str, splits: int) -> None:
    """A chain of N nodes after a prefix of L is ordinary causal attention over L + N tokens."""
    n, prefixes = 6, [0, 9, 40]
    parents = chain_parents([n] * 3, n).tolist()
    batch = make_verify_batch(prefixes, parents, 8, 2, 32, torch.float32, device, seed=3)
    out = verify_attention(*batch.args(), num_kv_splits=splits)
    ref = verify_attention_ref(*batch.args())
    for i, pre in enumerate(prefixes):
        row = batch.req_pool_indices[i]
        slots = torch.cat([batch.req_to_token[row, :pre].long(), batch.draft_loc[i]])
        rows = slice(i * n, (i + 1) * n)
        causal = dense_attention_sdpa(
            batch.q[rows], batch.k_buffer[slots], batch.v_buffer[slots]
        )  # fmt: skip
        assert_close(out[rows], causal, torch.float32, f"chain {i} vs causal")
        assert_close(ref[rows], causal, torch.float32, f"reference chain {i} vs causal")


@needs_triton
@pytest.mark.parametrize(
    ("window", "softcap"), [(8, None), (2, 5.0), (50, None), (100, 3.0), (None, 2.0)]
)
def test_window_and_softcap(device: str, window: int | None, softcap: float | None) -> None:
    """Windows shorter than the tree (deep nodes lose their root), shorter than the prefix (each
    depth sees a different part of it; 50: split and merged), longer than everything; soft caps;
    a custom scale."""
    rng = random.Random(5)
    n = 12
    parents = [chain_parents([n], n)[0].tolist(), random_parents(rng, n, n)]
    parents.append(random_parents(rng, n, 7))
    batch = make_verify_batch([30, 0, 75], parents, 4, 2, 32, torch.float32, device, seed=5)
    kw = {"window": window, "softcap": softcap}
    out = verify_attention(*batch.args(), 0.3, num_kv_splits=4, **kw)
    assert_close(out, verify_attention_ref(*batch.args(), 0.3, **kw), torch.float32, "reference")
    naive = naive_verify(batch, 0.3, **kw)
    assert_close(out.cpu(), naive, torch.float32, "naive")


@needs_triton
@pytest.mark.parametrize(
    ("fp8", "dtype"), [(torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e5m2, torch.float16)]
)
def test_fp8_pool(device: str, fp8: torch.dtype, dtype: torch.dtype) -> None:
    rng = random.Random(7)
    parents = [random_parents(rng, 8, s) for s in (8, 3, 5)]
    batch = make_verify_batch([1, 40, 0], parents, 8, 2, 64, dtype, device, seed=7)
    scales = {"k_scale": 0.37, "v_scale": 1.7}
    batch.k_buffer = quantize_kv(batch.k_buffer, fp8, scales["k_scale"])
    batch.v_buffer = quantize_kv(batch.v_buffer, fp8, scales["v_scale"])
    out = verify_attention(*batch.args(), num_kv_splits=3, **scales)
    expected = verify_attention_ref(*batch.args(), **scales)
    assert_close(out, expected, dtype, "verify attention (fp8)")
    assert_close(out.cpu(), naive_verify(batch, **scales).to(dtype), dtype, "naive (fp8)")


@needs_triton
def test_fwd_preallocated_workspace_and_padding_request(device: str) -> None:
    """The graph-safe entry: a poisoned workspace sized for a larger batch, launched twice; a
    padding request (prefix 0, empty mask, slots 0 = NaN here) reads nothing and outputs 0."""
    n = 4
    parents = [[-1, 0, 1, 1], [-1, 0, 0, -1]]
    batch = make_verify_batch([50, 0], parents, 4, 2, 32, torch.float32, device, seed=9)
    batch.tree_mask[1] = 0
    batch.draft_loc[1] = 0
    mid_o, mid_lse = alloc_decode_workspace(5 * n, 4, 32, 4, device)
    mid_o.fill_(float("nan"))
    mid_lse.fill_(float("nan"))
    out = torch.full_like(batch.q, float("nan"))
    for _ in range(2):
        verify_attention_fwd(*batch.args(), out, mid_o, mid_lse, sm_scale=0.2)
    assert torch.all(out[n:] == 0)
    assert_close(out, verify_attention_ref(*batch.args(), sm_scale=0.2), torch.float32, "fwd")
    # a window whose prefix span (window - 1 = 32 keys) is exactly one tile: one split, written
    # directly, and the merge kernel must agree that there is nothing to merge
    mid_o.fill_(float("nan"))
    mid_lse.fill_(float("nan"))
    verify_attention_fwd(*batch.args(), out, mid_o, mid_lse, config=(16, 32, 4, 1), window=33)
    expected = verify_attention_ref(*batch.args(), window=33)
    assert_close(out, expected, torch.float32, "fwd, window of one tile")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("kv_dtype", "window", "nodes"),
    [(torch.bfloat16, None, 8), (torch.float8_e4m3fn, None, 16), (torch.bfloat16, 4096, 64)],
)
def test_verify_llama8b_shapes_cuda_graph(
    kv_dtype: torch.dtype, window: int | None, nodes: int
) -> None:
    """Llama-3-8B attention shapes (32 heads, 8 kv heads, 128 dims, bf16), long prefixes, trees
    and a chain, captured in a CUDA graph; the prefix lengths, positions and masks change
    between replays (shapes do not)."""
    rng = random.Random(nodes)
    prefixes = [9000, 1, 3000, 0, 500]
    parents = [random_parents(rng, nodes, rng.randint(1, nodes)) for _ in prefixes]
    parents[2] = chain_parents([nodes], nodes)[0].tolist()
    batch = make_verify_batch(prefixes, parents, 32, 8, 128, torch.bfloat16, "cuda", seed=11)
    scales = {"k_scale": 0.5, "v_scale": 1.5} if kv_dtype != torch.bfloat16 else {}
    batch.k_buffer = quantize_kv(batch.k_buffer, kv_dtype, scales.get("k_scale", 1.0))
    batch.v_buffer = quantize_kv(batch.v_buffer, kv_dtype, scales.get("v_scale", 1.0))
    splits = 16
    mid_o, mid_lse = alloc_decode_workspace(len(prefixes) * nodes, 32, 128, splits, "cuda")
    out = torch.full_like(batch.q, float("nan"))
    kw = {**scales, "window": window}
    verify_attention_fwd(*batch.args(), out, mid_o, mid_lse, **kw)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        verify_attention_fwd(*batch.args(), out, mid_o, mid_lse, **kw)
    batch.prefix_lens[0] = 6000  # data changes between replays
    batch.positions.view(len(prefixes), nodes)[0] -= 3000
    batch.tree_mask[4] = batch.tree_mask[4] & 1  # request 4: every node sees only the root
    out.fill_(float("nan"))
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    expected = verify_attention_ref(*batch.args(), **kw)
    assert_close(out, expected, torch.bfloat16, "verify attention (graph)")
