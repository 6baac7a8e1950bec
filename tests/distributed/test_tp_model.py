"""Tensor parallelism at the model level (runtime/distributed: sharding, layers, comm): TP=2 and
TP=3 gloo ranks on 127.0.0.1, each building its `ModelRunner` shard from the same weights, compute
the logits TP=1 computes (a batched prefill of two prompts, then batched greedy decode steps) and
the same greedy tokens; every rank ends with the full-vocabulary logits; a rank loads and holds
about 1/tp of the weights (the checkpoint is read piece by piece).

Models: a tiny Llama of 9 heads / 3 KV heads (the default model's uneven split at TP=2: whole KV
groups 2 + 1) with an untied head over an odd vocabulary (uneven vocab pieces), the tiny Qwen2-MoE
(4 heads / 2 KV heads: at TP=3 a KV head replicated on two ranks; routed experts cut along their
intermediate size plus a shared expert, qkv bias, windowed layers), and the default SmolLM2-135M
(GGUF, tied embeddings) in fp32.

One group of ranks per TP size runs every model (`_rank_main`), so the test pays start-up once.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from typing import Any

import pytest
import torch

from radixlm.runtime.distributed.comm import (
    all_gather,
    all_reduce,
    all_reduce_min,
    broadcast,
    broadcast_object,
)
from radixlm.runtime.distributed.sharding import (
    check_tp_size,
    even_range,
    head_split,
    local_config,
)
from radixlm.runtime.distributed.state import ParallelState, parallel_state, set_parallel_state
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs

# tests/tiny_models.py's: MoE (routed + shared experts, Mixtral's names), qk-norm, Phi-3's fused
# qkv / gate_up checkpoint tensors, Gemma's scaled embedding, GeGLU MLP and soft-capped logits
TINY_ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral", "phi3", "gemma2", "gemma3")
MODELS = ["llama9", *TINY_ARCHS, "default"]
PROMPTS = [[1, 9, 28, 25, 31, 7, 100, 42], [3, 50, 60]]
STEPS = 4
DEFAULT_PROMPTS = [[1, 9690, 28, 2545, 314, 30, 504, 3458], [1, 504, 3458, 282, 1345]]
DEFAULT_STEPS = 6


def greedy(runner: ModelRunner, prompts: list[list[int]], steps: int) -> dict[str, Any]:
    """One EXTEND of every prompt (logits of each last row), then `steps - 1` batched DECODE
    steps of the greedy tokens; returns the logits of every step (on the CPU) and the tokens."""

    def _t(values: list[int] | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(runner.device)

    rows, slots = [], []
    for p in prompts:
        row = runner.req_to_token.alloc()
        s = runner.kv_pool.allocator.alloc(len(p) + steps)
        runner.req_to_token.write(row, 0, s)
        rows.append(row)
        slots.append(s)
    lens = [len(p) for p in prompts]
    ends = _t(lens).cumsum(0)
    last = [int(e) - 1 for e in ends]
    batch = ForwardBatch(
        ForwardMode.EXTEND, len(prompts), _t([i for p in prompts for i in p]),
        _t([i for n in lens for i in range(n)]), torch.cat([s[:n] for s, n in zip(slots, lens)]),
        _t(rows), _t(lens), lens, [0] * len(prompts), lens, _t([0] * len(prompts)), _t(lens),
        ends - _t(lens), _t(last), last,
    )  # fmt: skip
    logits = [runner.compute_logits(runner.forward(batch))]
    tokens = [logits[-1].argmax(-1).tolist()]
    for step in range(steps - 1):
        pos = [n + step for n in lens]
        batch = ForwardBatch(
            ForwardMode.DECODE, len(prompts), _t(tokens[-1]), _t(pos),
            torch.stack([s[q] for s, q in zip(slots, pos)]), _t(rows), _t([q + 1 for q in pos]),
            [q + 1 for q in pos],
        )  # fmt: skip
        logits.append(runner.compute_logits(runner.forward(batch)))
        tokens.append(logits[-1].argmax(-1).tolist())
    for s, row in zip(slots, rows):
        runner.kv_pool.allocator.free(s)
        runner.req_to_token.free(row)
    return {"logits": torch.stack(logits).cpu(), "tokens": tokens}


def _param_bytes(runner: ModelRunner) -> int:
    return sum(p.numel() * p.element_size() for p in runner.model.parameters())


def _yielded_numel(path: str, load_format: str) -> int:
    source = resolve_model(path, load_format)
    return sum(t.numel() for _, t in source.iter_weights(torch.device("cpu"), torch.float32))


def _args(path: str | None, device: str, dtype: str = "float32") -> ServerArgs:
    return ServerArgs(
        model_path=path, dtype=dtype, device=device, max_total_tokens=256,
        max_running_requests=4, num_threads=1, cuda_graph_max_bs=4,
    )  # fmt: skip


def run_models(paths: dict[str, str | None], device: str = "cpu") -> dict[str, Any]:
    """Every check's numbers in this process (TP=1, or one rank of a group) on `device`."""
    out: dict[str, Any] = {}
    for name, path in paths.items():
        dtype = "bfloat16" if name.endswith("_bf16") else "float32"  # bf16: GPU only
        runner = ModelRunner(_args(path, device, dtype), resolve_model(path))
        if name.endswith("_fp8"):  # its weights as loaded (on CPU: de-quantised in place)
            layer = runner.model.layers[0]
            out[name] = {
                part: getattr(mod, part.split("_", 1)[1]).weight.detach().clone()
                for part, mod in (
                    ("attn_qkv_proj", layer.self_attn), ("attn_o_proj", layer.self_attn),
                    ("mlp_gate_up_proj", layer.mlp), ("mlp_down_proj", layer.mlp),
                )
            }  # fmt: skip
            continue
        default = name.startswith("default")
        prompts, steps = (DEFAULT_PROMPTS, DEFAULT_STEPS) if default else (PROMPTS, STEPS)
        out[name] = {
            **greedy(runner, prompts, steps),
            "param_bytes": _param_bytes(runner),
            "kv_heads": runner.kv_pool.k[0].shape[1],
            "kv_tokens": runner.kv_pool.allocator.capacity,
        }
        if not default and device == "cpu":
            out[name]["yielded"] = _yielded_numel(path, "auto")
            out[name]["yielded_dummy"] = _yielded_numel(path, "dummy")
        del runner
    return out


def _rank_main(
    rank: int, tp: int, port: int, paths: dict[str, str | None], out_dir: str, gpu: bool = False
) -> None:
    """One rank: gloo on the CPU, or NCCL on GPU `rank` (CUDA graphs capture its all-reduces)."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = f"cuda:{rank}" if gpu else "cpu"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=tp, timeout=timedelta(seconds=120),
    )  # fmt: skip
    try:
        set_parallel_state(ParallelState(rank, tp, dist.group.WORLD))
        out = run_models(paths, device)
        if gpu:
            torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
            return
        out["comm"] = {
            "min": all_reduce_min(10 + (rank + 1) % tp),
            "sum": all_reduce(torch.tensor([float(rank + 1)])).tolist(),
            "bcast": broadcast(torch.tensor([float(rank + 7)]), src=tp - 1).tolist(),
            "obj": broadcast_object({"from": rank}),
            "gather": all_gather(
                torch.full((2, rank + 1), float(rank)), sizes=list(range(1, tp + 1))
            ).tolist(),
        }
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _write_tiny_llama(path: str, fp8: bool = False) -> None:
    """A random Llama: 9 heads / 3 KV heads (the default model's), an untied head over 251 tokens;
    `fp8`: its projections as an FP8 checkpoint (one scale per row, k_proj's per tensor)."""
    from safetensors.torch import save_file

    from radixlm.runtime.models.fp8 import quantize_weight_fp8

    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 251,
        "hidden_size": 144, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }  # fmt: skip
    gen = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.08

    def norm(n: int) -> torch.Tensor:
        return 1.0 + torch.randn(n, generator=gen) * 0.1

    h, i, q, kv = 144, 96, 9 * 16, 3 * 16
    tensors = {"model.embed_tokens.weight": w(251, h) * 10, "model.norm.weight": norm(h)}
    tensors["lm_head.weight"] = w(251, h)
    for layer in range(2):
        p = f"model.layers.{layer}."
        for name, shape in (
            ("self_attn.q_proj", (q, h)), ("self_attn.k_proj", (kv, h)),
            ("self_attn.v_proj", (kv, h)), ("self_attn.o_proj", (h, q)),
            ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)), ("mlp.down_proj", (h, i)),
        ):  # fmt: skip
            tensors[p + name + ".weight"] = w(*shape)
        tensors[p + "input_layernorm.weight"] = norm(h)
        tensors[p + "post_attention_layernorm.weight"] = norm(h)
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        for name in [n for n in tensors if n.endswith("_proj.weight")]:
            q, scale = quantize_weight_fp8(tensors[name])
            if ".k_proj." in name:  # per tensor
                scale = scale.max()
                q = (tensors[name] / scale).to(torch.float8_e4m3fn)
            tensors[name], tensors[name + "_scale"] = q, scale[..., None]
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


@pytest.fixture(scope="module")
def models() -> dict[str, str | None]:
    from tiny_models import save_tiny

    root = tempfile.mkdtemp(prefix="radixlm-tp-")
    paths: dict[str, str | None] = {"llama9": os.path.join(root, "llama9")}
    _write_tiny_llama(paths["llama9"])
    paths["llama9_fp8"] = os.path.join(root, "llama9_fp8")
    _write_tiny_llama(paths["llama9_fp8"], fp8=True)
    for name in TINY_ARCHS:
        paths[name] = os.path.join(root, name)
        save_tiny(name, paths[name])
    paths["default"] = None
    return paths


@pytest.fixture(scope="module")
def reference(models: dict[str, str | None]) -> dict[str, Any]:
    assert not parallel_state().is_parallel
    return run_models(models)


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def ranks(request, models: dict[str, str | None]) -> tuple[int, list[dict[str, Any]]]:
    """(tp, each rank's results) from one spawned gloo group running every model."""
    import torch.multiprocessing as mp

    from server_process import free_port

    tp = request.param
    with tempfile.TemporaryDirectory(prefix="radixlm-tp-out-") as out_dir:
        mp.spawn(_rank_main, args=(tp, free_port(), models, out_dir), nprocs=tp, join=True)
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(tp)]
    return tp, results


# ---- the split itself (no processes) -----------------------------------------------------------
def test_head_split_keeps_every_rank_a_regular_gqa_shard() -> None:
    """Every q head lands on exactly one rank, next to the KV head it reads, for the default
    model's 9 / 3 heads and a few other shapes at every TP up to the number of heads."""
    for heads, kv in ((9, 3), (4, 2), (32, 8), (8, 1), (6, 6)):
        for tp in range(1, heads + 1):
            group = heads // kv
            splits = [head_split(heads, kv, tp, r) for r in range(tp)]
            covered = [h for s in splits for h in range(s.q_start, s.q_start + s.q_heads)]
            assert covered == list(range(heads)), (heads, kv, tp)
            for s in splits:
                assert s.q_heads >= 1 and s.q_heads % s.kv_heads == 0
                local_group = s.q_heads // s.kv_heads
                for j in range(s.q_heads):  # local GQA: q head j reads local KV head j // group
                    assert (s.q_start + j) // group == s.kv_start + j // local_group
    assert [head_split(9, 3, 2, r) for r in range(2)] == [(0, 6, 0, 2), (6, 3, 2, 1)]


def test_check_tp_size_names_the_heads() -> None:
    cfg = resolve_model(None).config  # 9 heads, 3 KV heads
    for tp in (1, 2, 3, 9):
        check_tp_size(cfg, tp)
    with pytest.raises(ValueError, match="9 attention heads"):
        check_tp_size(cfg, 10)


def test_local_config_shapes() -> None:
    cfg = resolve_model(None).config
    local = local_config(cfg, ParallelState(1, 3, None))
    assert (local.num_attention_heads, local.num_key_value_heads) == (3, 1)
    assert local.intermediate_size * 3 == cfg.intermediate_size
    assert local.vocab_size == cfg.vocab_size and local.head_dim == cfg.head_dim
    assert local_config(cfg, ParallelState()) is cfg


# ---- the ranks against TP=1 --------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_logits_and_greedy_tokens_equal_tp1(
    ranks: tuple[int, list[dict[str, Any]]], reference: dict[str, Any], model: str
) -> None:
    tp, results = ranks
    ref = reference[model]
    for rank, res in enumerate(results):  # every rank gets the full-vocabulary logits
        got = res[model]
        assert got["logits"].shape == ref["logits"].shape, (tp, rank)
        torch.testing.assert_close(got["logits"], ref["logits"], rtol=1e-4, atol=1e-4)
        assert got["tokens"] == ref["tokens"], (tp, rank)


@pytest.mark.parametrize("model", MODELS)
def test_each_rank_holds_its_share_of_the_weights(
    ranks: tuple[int, list[dict[str, Any]]], reference: dict[str, Any], model: str
) -> None:
    """Per-rank parameter bytes are ~1/tp of TP=1's (attention of an uneven head split and
    replicated norms / routers / KV heads add a little); together they are ~the whole model."""
    tp, results = ranks
    full = reference[model]["param_bytes"]
    per_rank = [res[model]["param_bytes"] for res in results]
    assert max(per_rank) < full / tp * (1.3 if model != "default" else 1.1), (tp, per_rank, full)
    assert full <= sum(per_rank) < full * 1.15, (tp, per_rank, full)
    # KV: this rank's heads only, and the same number of slots on every rank
    assert len({res[model]["kv_tokens"] for res in results}) == 1
    heads = [res[model]["kv_heads"] for res in results]
    assert sum(heads) >= reference[model]["kv_heads"] and max(heads) < reference[model]["kv_heads"]


@pytest.mark.parametrize("model", ["llama9", "qwen2_moe"])
def test_checkpoint_is_read_piece_by_piece(
    ranks: tuple[int, list[dict[str, Any]]], reference: dict[str, Any], model: str
) -> None:
    """What a rank's weight source yields (safetensors slices, dummy tensors generated at the
    piece's shape) is its own pieces: about 1/tp of what TP=1 reads, never a full tensor of a
    split layer."""
    tp, results = ranks
    for key in ("yielded", "yielded_dummy"):
        full = reference[model][key]
        per_rank = [res[model][key] for res in results]
        assert max(per_rank) < full / tp * 1.3, (key, tp, per_rank, full)
        assert full <= sum(per_rank) < full * 1.15, (key, tp, per_rank, full)


def test_collectives(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    """comm.py over the group: a min, a sum, broadcasts from the last rank (a tensor, an object),
    an all-gather of uneven pieces; and at TP=1 each is the identity."""
    tp, results = ranks
    gathered = [[float(r) for r in range(tp) for _ in range(r + 1)]] * 2
    for res in results:
        assert res["comm"] == {
            "min": 10,
            "sum": [tp * (tp + 1) / 2],
            "bcast": [float(tp - 1 + 7)],
            "obj": {"from": 0},
            "gather": gathered,
        }
    x = torch.ones(2, 3)
    assert all_reduce(x) is x and all_gather(x) is x and broadcast(x) is x
    assert all_reduce_min(5) == 5 and broadcast_object("a") == "a"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_nccl_tp2_equals_tp1_with_cuda_graphs(models: dict[str, str | None]) -> None:
    """The same parity over NCCL on two GPUs, decode steps replayed from CUDA graphs (which
    capture the row-parallel all-reduces), fp32 so that TP=1 is the oracle."""
    import torch.multiprocessing as mp

    from server_process import free_port

    paths = {"llama9": models["llama9"], "qwen2_moe": models["qwen2_moe"], "default": None}
    paths["default_bf16"] = None  # the GPU default dtype: decode GEMMs chosen per rank too
    ref = run_models(paths, "cuda:0")
    torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix="radixlm-tp-out-") as out_dir:
        mp.spawn(_rank_main, args=(2, free_port(), paths, out_dir, True), nprocs=2, join=True)
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    for model in paths:
        for res in results:
            got, want = res[model]["logits"], ref[model]["logits"]
            if model.endswith("_bf16"):  # other sums in bf16: the prefill's logits close, its
                # tokens equal (later steps may diverge on a near tie)
                cos = torch.nn.functional.cosine_similarity(got[0], want[0])
                assert cos.min() > 0.995, cos
                assert res[model]["tokens"][0] == ref[model]["tokens"][0]
                continue
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
            assert res[model]["tokens"] == ref[model]["tokens"], model


def test_fp8_checkpoint_scales_follow_their_rows(
    ranks: tuple[int, list[dict[str, Any]]], reference: dict[str, Any]
) -> None:
    """An FP8 checkpoint at TP > 1: per-row scales are cut with the rows of column-parallel
    weights (q/k/v, gate/up), kept whole for row-parallel ones (o, down: their rows are not
    split), a per-tensor scale is shared; each rank's de-quantised weights are exactly its slice
    of TP=1's."""
    tp, results = ranks
    ref = reference["llama9_fp8"]
    d, inter, q_size, kv_size = 16, 96, 144, 48
    for rank, res in enumerate(results):
        heads = head_split(9, 3, tp, rank)
        q = slice(heads.q_start * d, (heads.q_start + heads.q_heads) * d)
        kv = slice(heads.kv_start * d, (heads.kv_start + heads.kv_heads) * d)
        a, b = even_range(inter, tp, rank)
        qkv = ref["attn_qkv_proj"]
        want = {
            "attn_qkv_proj": torch.cat([qkv[q], qkv[q_size:][kv], qkv[q_size + kv_size :][kv]]),
            "attn_o_proj": ref["attn_o_proj"][:, q],
            "mlp_gate_up_proj": torch.cat(
                [ref["mlp_gate_up_proj"][a:b], ref["mlp_gate_up_proj"][inter + a : inter + b]]
            ),
            "mlp_down_proj": ref["mlp_down_proj"][:, a:b],
        }
        for part, w in want.items():
            assert torch.equal(res["llama9_fp8"][part], w), (tp, rank, part)
