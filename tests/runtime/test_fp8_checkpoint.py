"""FP8 checkpoints (`quantization_config`: `quant_method: fp8`, or compressed-tensors FP8): their
FP8 weights and scales load as the layers online quantisation makes, their KV-cache scales reach an
FP8 pool, and every unsupported scheme or inconsistent checkpoint is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from radixlm.kernels.quant_fp8 import FP8_DTYPE, FP8_MAX
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.config import ModelConfig, UnsupportedModelError
from radixlm.runtime.models.fp8 import dequantize_fp8, quantize_weight_fp8
from radixlm.runtime.models.llama import Linear
from radixlm.runtime.models.loader import _iter_dummy, resolve_model
from radixlm.runtime.models.presets import PRESETS
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "static"}
PER_TENSOR = ("q_proj", "k_proj", "v_proj", "o_proj")  # the others: one scale per row
KV_SCALES = {  # layer 0 in vLLM's names, layer 1 in AutoFP8's older single scale
    "model.layers.0.self_attn.k_scale": 0.5,
    "model.layers.0.self_attn.v_scale": 0.25,
    "model.layers.1.self_attn.kv_scale": 2.0,
}


def _write(path: Path, qcfg: dict | None = FP8_CONFIG, per_tensor=PER_TENSOR) -> dict:
    """tiny-llama's (CPU-seeded) dummy weights as a checkpoint, FP8 unless `qcfg` is None;
    returns its tensors."""
    cfg = dict(PRESETS["tiny-llama"])
    weights = dict(_iter_dummy(ModelConfig.from_hf_dict(cfg), torch.device("cpu"), torch.float32))
    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        proj = name.split(".")[-2]
        if qcfg is None or not name.endswith("_proj.weight"):
            tensors[name] = w
        elif proj in per_tensor:
            scale = w.abs().max() / FP8_MAX
            tensors[name] = (w / scale).to(FP8_DTYPE)
            tensors[name + "_scale"] = scale.reshape(())
            tensors[name.replace(".weight", ".input_scale")] = torch.tensor(0.5)  # ignored
        else:
            tensors[name], scale = quantize_weight_fp8(w)
            tensors[name + "_scale"] = scale[:, None]
    if qcfg is not None:
        tensors.update({k: torch.tensor(v) for k, v in KV_SCALES.items()})
        cfg["quantization_config"] = qcfg
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return tensors


def _runner(model_path: str, load_format: str = "auto", **kwargs) -> ModelRunner:
    args = ServerArgs(
        model_path=model_path,
        load_format=load_format,
        max_total_tokens=256,
        max_running_requests=2,
        dtype="float32",
        random_seed=0,
        **kwargs,
    )
    return ModelRunner(args, resolve_model(model_path, args.load_format))


def _linears(runner: ModelRunner) -> list[Linear]:
    return [m for m in runner.model.modules() if isinstance(m, Linear)]


def _dequantized(linear: Linear) -> torch.Tensor:
    w = linear.weight
    return dequantize_fp8(w, linear.weight_scale, torch.float32) if w.dtype == FP8_DTYPE else w


def test_fp8_checkpoint_loads_its_weights_scales_and_kv_scales(tmp_path) -> None:
    tensors = _write(tmp_path)
    runner = _runner(str(tmp_path), kv_cache_dtype="fp8_e4m3")
    linears = _linears(runner)
    assert len(linears) == 2 * 4 and all(m.fp8 for m in linears)
    attn, mlp = runner.model.layers[1].self_attn, runner.model.layers[1].mlp
    # q/k/v merged: each part keeps its own per-tensor scale on its rows
    q_scale, k_scale = (
        float(tensors[f"model.layers.1.self_attn.{p}_proj.weight_scale"]) for p in "qk"
    )
    scales = attn.qkv_proj.weight_scale.tolist()  # rows: q 64 (4 heads x 16), k 32, v 32
    assert scales[:64] == [q_scale] * 64 and scales[64:96] == [k_scale] * 32
    expected = torch.cat(
        [
            tensors[f"model.layers.1.mlp.{p}_proj.weight"].float()
            * tensors[f"model.layers.1.mlp.{p}_proj.weight_scale"]
            for p in ("gate", "up")
        ]
    )
    torch.testing.assert_close(_dequantized(mlp.gate_up_proj).cpu(), expected, rtol=0, atol=0)
    assert runner.kv_pool.k_scale == [0.5, 2.0] and runner.kv_pool.v_scale == [0.25, 2.0]
    # A model-dtype KV cache has no use for them.
    assert _runner(str(tmp_path)).kv_pool.k_scale == [1.0, 1.0]


def test_per_channel_checkpoint_equals_online_quantization(tmp_path) -> None:
    """Weights quantised per row, as `quantization="fp8"` does at load: the same model."""
    _write(tmp_path / "fp8", per_tensor=())
    _write(tmp_path / "plain", qcfg=None)
    from_checkpoint = _runner(str(tmp_path / "fp8"))
    online = _runner(str(tmp_path / "plain"), quantization="fp8")
    for a, b in zip(_linears(from_checkpoint), _linears(online), strict=True):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.weight_scale, b.weight_scale)
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    assert torch.equal(runner_logits(from_checkpoint, ids), runner_logits(online, ids))


def test_per_tensor_checkpoint_tracks_the_unquantized_model(tmp_path) -> None:
    _write(tmp_path / "fp8")
    _write(tmp_path / "plain", qcfg=None)
    plain, fp8 = _runner(str(tmp_path / "plain")), _runner(str(tmp_path / "fp8"))
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, got = runner_logits(plain, ids), runner_logits(fp8, ids)
    assert (got - ref).norm() / ref.norm() < 0.1
    assert torch.nn.functional.cosine_similarity(got, ref, dim=-1).min() > 0.99


def test_compressed_tensors_fp8_and_dummy_weights_of_an_fp8_config(tmp_path) -> None:
    group = {
        "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
        "targets": ["Linear"],
    }
    qcfg = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    _write(tmp_path, qcfg, per_tensor=())
    assert all(m.fp8 for m in _linears(_runner(str(tmp_path))))
    # dummy weights for the same config run as FP8 layers (quantised online)
    dummy = _runner(str(tmp_path), load_format="dummy")
    assert all(m.fp8 for m in _linears(dummy)) and dummy.model.kv_scales == {}


@pytest.mark.parametrize(
    ("qcfg", "message"),
    [
        ({**FP8_CONFIG, "weight_block_size": [128, 128]}, "weight_block_size"),
        ({"quant_method": "gptq", "bits": 4}, "'gptq'"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"type": "int", "num_bits": 4}}},
            },
            "'g'",
        ),
    ],
    ids=["block-wise", "gptq", "int4"],
)
def test_unsupported_quantization_is_refused_by_name(tmp_path, qcfg, message) -> None:
    _write(tmp_path, qcfg)
    with pytest.raises(UnsupportedModelError, match=message):
        resolve_model(str(tmp_path))


def _rewrite(path: Path, change) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("model.layers.0.mlp.down_proj.weight_scale"), "do not pair up"),
        (
            lambda t: t.update({"model.layers.0.mlp.down_proj.weight_scale": torch.ones(4, 2)}),
            "block-wise",
        ),
        (
            lambda t: t.update({"model.layers.1.self_attn.k_scale": torch.tensor(0.0)}),
            "not usable",
        ),
        (
            lambda t: t.update(
                {"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64).bfloat16()}
            ),
            "mixes FP8 and unquantised",
        ),
    ],
    ids=["missing-scale", "block-scale", "zero-kv-scale", "mixed-parts"],
)
def test_inconsistent_fp8_checkpoint_is_refused_by_name(tmp_path, change, message) -> None:
    _write(tmp_path)
    _rewrite(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        _runner(str(tmp_path))
