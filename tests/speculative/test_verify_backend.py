"""Tree verify through the attention backends (torch, and triton in the interpreter on CPU): each
agrees with the reference kernel on per-layer windows/soft caps/scales and FP8 pools; a chain
verified with its mask equals the same batch run as a plain causal extend; and inside the real
(tiny, random-weight) model, every node's hidden state equals an ordinary prefill of the prefix
plus that node's root path."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from radixlm.kernels.verify_attention_ref import verify_attention_ref
from radixlm.runtime.attention.base import LayerAttention
from radixlm.runtime.attention.torch_backend import TorchAttnBackend
from radixlm.runtime.attention.triton_backend import TritonAttnBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem.kv_pool import KVPool, ReqToTokenPool
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.tree import (
    alloc_draft_slots,
    build_tree,
    chain_parents,
    verify_forward_batch,
)

BACKENDS = {"torch": TorchAttnBackend, "triton": TritonAttnBackend}
# NOTE: on CPU the triton backend runs in the interpreter (tests/conftest.py sets it)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, KV_HEADS, DIM = 8, 2, 32
LAYERS = [LayerAttention(None, None, 0.25), LayerAttention(6, 3.0, 0.3)]


def random_parents(rng: random.Random, n: int, size: int) -> list[int]:
    return [-1] + [rng.randrange(j) for j in range(1, size)] + [-1] * (n - size)


def _setup(kv_dtype: torch.dtype, parents: list[list[int]], prefixes: list[int], seed: int = 0):
    """A pool whose requests hold random prefixes (both layers), their trees' slots, the verify
    batch, and random q/k/v for its rows."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(300, len(LAYERS), KV_HEADS, DIM, kv_dtype, DEVICE)
    if kv_dtype != torch.float32:
        pool.k_scale, pool.v_scale = [0.5, 0.75], [1.5, 1.25]
    table = ReqToTokenPool(5, 300, DEVICE)
    rows = [table.alloc() for _ in prefixes]
    for row, pre in zip(rows, prefixes):
        slots = pool.allocator.alloc(pre)
        table.write(row, 0, slots)
        for layer in range(len(LAYERS)):
            kv = torch.randn(2, pre, KV_HEADS, DIM, generator=gen)
            pool.store(layer, slots, kv[0].to(DEVICE), kv[1].to(DEVICE))
    n = len(parents[0])
    sizes = [1 + sum(p >= 0 for p in row[1:]) for row in parents]
    draft_loc = alloc_draft_slots(pool.allocator, sizes, n)
    tree = build_tree(torch.tensor(parents), torch.tensor(prefixes), check=True)
    ids = torch.zeros(len(prefixes) * n, dtype=torch.int64, device=DEVICE)
    batch = verify_forward_batch(ids, torch.tensor(rows), prefixes, draft_loc, tree)
    t = len(prefixes) * n
    q = torch.randn(t, HEADS, DIM, generator=gen)
    k, v = torch.randn(2, t, KV_HEADS, DIM, generator=gen)
    return pool, table, batch, (q.to(DEVICE), k.to(DEVICE), v.to(DEVICE))


def _backend(name: str, pool: KVPool, table: ReqToTokenPool):
    backend = BACKENDS[name](pool, table, HEADS, KV_HEADS, DIM)
    backend.set_layer_attention(LAYERS)
    return backend


def _run(backend, batch: ForwardBatch, qkv, layer: int, rows_only: bool = False):
    batch = dataclasses.replace(batch, attn_metadata=None)
    backend.init_forward_metadata(batch)
    return backend.forward(*qkv, layer, batch, rows_only=rows_only)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_backends_match_the_reference(kv_dtype: torch.dtype) -> None:
    """Requests with prefixes 0, 20 and 45 (the window of layer 1 cuts the last two), random
    trees with padding nodes; both layers' specs; rows_only returns the logits rows."""
    rng = random.Random(2)
    parents = [random_parents(rng, 8, s) for s in (8, 3, 6)]
    prefixes = [0, 20, 45]
    pool, table, batch, qkv = _setup(kv_dtype, parents, prefixes)
    outs = {}
    for name in BACKENDS:
        backend = _backend(name, pool, table)
        for layer, spec in enumerate(LAYERS):
            out = _run(backend, batch, qkv, layer)
            expected = verify_attention_ref(
                qkv[0], pool.k[layer], pool.v[layer], table.table, batch.req_pool_indices,
                batch.extend_prefix_lens, batch.out_cache_loc.view(3, 8), batch.tree_mask,
                batch.positions, spec.scale, pool.k_scale[layer], pool.v_scale[layer],
                spec.window, spec.softcap,
            )  # fmt: skip
            assert not torch.isnan(out).any()
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            outs[name, layer] = out
        rows = [0, 5, 9, 23]
        picked = dataclasses.replace(batch, logits_indices=torch.tensor(rows, device=DEVICE))
        picked.logits_indices_cpu = rows
        out = _run(backend, picked, qkv, 0, rows_only=True)
        torch.testing.assert_close(out, outs[name, 0][rows])


@pytest.mark.parametrize("name", list(BACKENDS))
def test_chain_verify_equals_causal_extend(name: str) -> None:
    """A chain's tree verify and the same rows as a plain extend (no mask: causal) agree, on
    the global layer and the windowed, soft-capped one."""
    n, prefixes = 5, [7, 0, 30]
    parents = chain_parents([n] * 3, n).tolist()
    pool, table, batch, qkv = _setup(torch.float32, parents, prefixes, seed=4)
    backend = _backend(name, pool, table)
    plain = dataclasses.replace(batch, tree_mask=None)
    for layer in range(len(LAYERS)):
        tree_out = _run(backend, batch, qkv, layer)
        torch.testing.assert_close(tree_out, _run(backend, plain, qkv, layer), rtol=1e-5, atol=1e-5)


def test_triton_verify_graph_workspace_equals_eager() -> None:
    """The CUDA-graph path of the triton backend without the graph: a static workspace sized for
    the largest verify batch and the longest context (more splits than the eager heuristic),
    poisoned, then the forward with that metadata gives the eager output."""
    rng = random.Random(6)
    parents = [random_parents(rng, 8, s) for s in (8, 5)]
    pool, table, batch, qkv = _setup(torch.float32, parents, [40, 3], seed=6)
    backend = _backend("triton", pool, table)
    eager = [_run(backend, batch, qkv, layer) for layer in range(len(LAYERS))]
    backend.init_verify_graph_state(4, [8])
    backend._verify_buffer.fill_(float("nan"))
    static = dataclasses.replace(batch, attn_metadata=None)
    backend.prepare_capture(2, static)
    assert static.attn_metadata.mid_o.shape[:3] == (16, HEADS, 2)  # eager: 1 split
    for layer in range(len(LAYERS)):
        out = backend.forward(*qkv, layer, static)
        torch.testing.assert_close(out, eager[layer], rtol=1e-5, atol=1e-5)


def _runner(backend: str) -> ModelRunner:
    args = ServerArgs(
        model_path="tiny-llama",
        load_format="dummy",
        attention_backend=backend,
        max_total_tokens=512,
        max_running_requests=4,
        disable_cuda_graph=True,
        dtype="float32",
    )
    runner = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
    # NOTE: the dummy weights (+-0.02) make attention almost uniform, blind to positions and
    # masks: sharpen it so that a wrong rotary position or a wrongly visible node shows.
    for layer in runner.model.layers:
        layer.self_attn.qkv_proj.weight.mul_(40.0)
    return runner


def _prefill(runner: ModelRunner, row: int, tokens: list[int]) -> torch.Tensor:
    """An ordinary prefill of `tokens` into request row `row` (fresh slots): hidden states of
    every row."""
    n = len(tokens)
    slots = runner.kv_pool.allocator.alloc(n)
    runner.req_to_token.write(row, 0, slots)
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=runner.device)  # noqa: E731
    fb = ForwardBatch(
        ForwardMode.EXTEND, 1, t(tokens), t(list(range(n))), slots.to(runner.device), t([row]),
        t([n]), [n], [0], [n], t([0]), t([n]), t([0]),
    )  # fmt: skip
    return runner.forward(fb)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_tree_verify_in_the_model_equals_prefill_of_each_path(backend: str) -> None:
    """Two requests with cached prefixes verify trees of 6 nodes in one forward (rotary at
    prefix + depth, K/V stored at the draft slots); node j's hidden state equals the last row
    of a prefill of prefix + the tokens on j's root path."""
    runner = _runner(backend)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 500) for _ in range(k)] for k in (9, 17)]
    for row, prompt in enumerate(prompts):
        _prefill(runner, row, prompt)
    parents = [[-1, 0, 0, 1, 1, 3], [-1, 0, 1, 0, 3, -1]]
    tokens = [[rng.randrange(3, 500) for _ in range(6)] for _ in prompts]
    prefixes = [len(p) for p in prompts]
    draft_loc = alloc_draft_slots(runner.kv_pool.allocator, [6, 5], 6)
    tree = build_tree(torch.tensor(parents), torch.tensor(prefixes), check=True)
    ids = torch.tensor(tokens).view(-1).to(runner.device)
    batch = verify_forward_batch(ids, torch.tensor([0, 1]), prefixes, draft_loc, tree)
    hidden = runner.forward(batch)
    for i, (prompt, par) in enumerate(zip(prompts, parents)):
        for j in range(6 if i == 0 else 5):
            path = [j]
            while path[-1] != 0:
                path.append(par[path[-1]])
            ref = _prefill(runner, 2, prompt + [tokens[i][a] for a in reversed(path)])
            torch.testing.assert_close(hidden[i * 6 + j], ref[-1], rtol=2e-4, atol=2e-4)
