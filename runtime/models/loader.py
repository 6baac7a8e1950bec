"""Where weights come from: a Hugging Face directory (config.json + safetensors), a GGUF file, or
random `dummy` weights of a config's shapes. Every source yields (HF-name, tensor) pairs that
`LlamaForCausalLM.load_weights` consumes, plus a `ModelConfig`."""

from __future__ import annotations

import functools
import glob
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.distributed.sharding import Shard, checkpoint_shard
from radixlm.runtime.distributed.state import parallel_state
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.default_model import ModelNotFoundError, default_model_path
from radixlm.runtime.models.gguf_file import GGUFFile, unpermute_rows
from radixlm.runtime.models.hf_cache import is_repo_id, local_model_path
from radixlm.runtime.models.presets import PRESETS


@dataclass(frozen=True)
class ModelSource:
    path: str  # a GGUF file, an HF directory, or a preset name (dummy)
    load_format: str  # "gguf" | "safetensors" | "dummy"
    config: ModelConfig
    gguf: GGUFFile | None = None

    def iter_weights(
        self, device: torch.device, dtype: torch.dtype
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) pairs; at TP > 1 (`parallel_state()`) each tensor is this rank's
        piece only (`sharding.checkpoint_shard`): safetensors read just those rows/columns
        (`get_slice`), dummy weights are generated at the piece's shape, and a GGUF tensor is
        de-quantised alone, cut, and dropped before the next one (never the whole model)."""
        state = parallel_state()
        shard = None
        if state.is_parallel:
            shard = functools.partial(checkpoint_shard, config=self.config, state=state)
        if self.load_format == "gguf":
            assert self.gguf is not None
            tensors = _iter_gguf(self.gguf, self.config)
            yield from tensors if shard is None else _cut(tensors, shard)
        elif self.load_format == "safetensors":
            yield from _iter_safetensors(self.path, shard)
        else:
            yield from _iter_dummy(self.config, device, dtype, shard)


def resolve_model(model_path: str | None, load_format: str = "auto") -> ModelSource:
    path = model_path or default_model_path()
    if load_format == "dummy":
        if is_repo_id(path) and path not in PRESETS:
            path = local_model_path(path)  # its config.json from the local HF cache
        if path in PRESETS:
            return ModelSource(path, "dummy", ModelConfig.from_hf_dict(PRESETS[path]))
        if os.path.exists(path) and not path.endswith(".gguf"):
            return ModelSource(path, "dummy", ModelConfig.from_path(path))
        if path.endswith(".gguf") and os.path.exists(path):
            gguf = GGUFFile(path)
            return ModelSource(path, "dummy", gguf_config(gguf))
        raise ModelNotFoundError(
            f"dummy weights need a preset ({', '.join(sorted(PRESETS))}) or a config path; got {path!r}"
        )
    path = local_model_path(path)  # a HF repo id: its cached snapshot (never downloaded)
    if path.endswith(".gguf") or load_format == "gguf":
        gguf = GGUFFile(path)
        return ModelSource(path, "gguf", gguf_config(gguf), gguf)
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise ModelNotFoundError(f"{path!r} has no config.json")
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if not glob.glob(os.path.join(path, "*.safetensors")):
            if ggufs:
                return resolve_model(ggufs[0], "gguf")
            raise ModelNotFoundError(f"{path!r} holds no *.safetensors weights")
        return ModelSource(path, "safetensors", ModelConfig.from_path(path))
    raise ModelNotFoundError(f"cannot load {path!r}: expected a GGUF file or an HF model directory")


# ---- GGUF ---------------------------------------------------------------------------------------
_GGUF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def gguf_config(gguf: GGUFFile) -> ModelConfig:
    arch = gguf.architecture
    # the other registered architectures (registry.py), Mixtral (a llama with experts) included
    if arch not in _GGUF_ARCH or gguf.metadata.get(f"{arch}.expert_count"):
        from radixlm.runtime.models.gguf_arch import gguf_arch_config

        return gguf_arch_config(gguf)
    md = gguf.metadata

    def get(key: str, default=None):
        return md.get(f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    vocab = get("vocab_size") or len(md.get("tokenizer.ggml.tokens", []))
    cfg = {
        "architectures": [_GGUF_ARCH[arch]],
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
    }
    from radixlm.runtime.models.gguf_arch import gguf_rope_scaling

    cfg["rope_scaling"] = gguf_rope_scaling(gguf)  # linear, or Llama 3's `rope_freqs.weight`
    return ModelConfig.from_hf_dict(cfg)


_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _iter_gguf(gguf: GGUFFile, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    if gguf.architecture not in _GGUF_ARCH or cfg.num_experts:
        from radixlm.runtime.models.gguf_arch import iter_gguf_arch

        yield from iter_gguf_arch(gguf, cfg)
        return
    permute = gguf.architecture == "llama"  # llama.cpp interleaves q/k rows for its rope layout
    for name, tensor in gguf.tensors.items():
        if name.startswith("rope_"):
            continue
        data = tensor.to_torch()
        if name == "token_embd.weight":
            yield "model.embed_tokens.weight", data
        elif name == "output_norm.weight":
            yield "model.norm.weight", data
        elif name == "output.weight":
            yield "lm_head.weight", data
        elif name.startswith("blk."):
            _, layer, part, kind = name.split(".", 3)
            if permute and part in ("attn_q", "attn_k") and kind == "weight":
                heads = cfg.num_attention_heads if part == "attn_q" else cfg.num_key_value_heads
                data = unpermute_rows(data, heads)
            yield f"model.layers.{layer}.{_GGUF_NAMES[part]}.{kind}", data
        else:
            raise KeyError(f"unexpected GGUF tensor {name!r}")


# ---- tensor-parallel pieces ----------------------------------------------------------------------
ShardOf = Callable[[str, tuple[int, ...]], "Shard | None"]


def _cut(
    tensors: Iterable[tuple[str, torch.Tensor]], shard: ShardOf
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t in tensors:
        piece = shard(name, tuple(t.shape))
        yield name, t if piece is None else piece.take(t)


def _read_piece(sl: Any, piece: Shard) -> torch.Tensor:
    """The rows/columns of a safetensors slice that `piece` names, read from the file alone."""
    parts = [sl[a:b] if piece.dim == 0 else sl[:, a:b] for a, b in piece.ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, piece.dim)


# ---- safetensors / dummy -------------------------------------------------------------------------
def _iter_safetensors(
    path: str, shard: ShardOf | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if shard is None:
                    yield name, f.get_tensor(name)
                    continue
                sl = f.get_slice(name)
                piece = shard(name, tuple(sl.get_shape()))
                yield name, f.get_tensor(name) if piece is None else _read_piece(sl, piece)


def _iter_dummy(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, shard: ShardOf | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights of the config's shapes under its checkpoint names, generated on the target
    device (seeded); with `shard` (TP > 1) at the shape of this rank's piece only. Norm weights
    are the identity: ones, zeros for Gemma's `(1 + w)` norms."""
    gen = torch.Generator(device=device).manual_seed(0)
    gemma = cfg.model_type.startswith("gemma")
    for name, shape, scale in _dummy_shapes(cfg):
        piece = None if shard is None else shard(name, shape)
        if piece is not None:
            shape = piece.shape(shape)
        if scale is None:  # a norm
            yield name, (torch.zeros if gemma else torch.ones)(shape, device=device, dtype=dtype)
        else:
            t = torch.empty(shape, device=device, dtype=torch.float32)
            yield name, t.uniform_(-scale, scale, generator=gen).to(dtype)


def _dummy_shapes(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...], float | None]]:
    """(checkpoint name, full shape, uniform range or None for a norm) of every dummy tensor."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    mt = cfg.model_type
    gemma = mt.startswith("gemma")

    def rand(*shape: int, scale: float = 0.02) -> tuple[tuple[int, ...], float]:
        return shape, scale

    def norm(size: int) -> tuple[tuple[int, ...], None]:
        return (size,), None

    norms = ["input_layernorm", "post_attention_layernorm"]
    if gemma:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    yield "model.embed_tokens.weight", *rand(cfg.vocab_size, h, scale=1.0)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        if mt == "phi3":  # fused in the checkpoint
            yield p + "self_attn.qkv_proj.weight", *rand(cfg.q_size + 2 * cfg.kv_size, h)
        else:
            yield p + "self_attn.q_proj.weight", *rand(cfg.q_size, h)
            yield p + "self_attn.k_proj.weight", *rand(cfg.kv_size, h)
            yield p + "self_attn.v_proj.weight", *rand(cfg.kv_size, h)
        if cfg.attention_bias:
            yield p + "self_attn.q_proj.bias", *rand(cfg.q_size)
            yield p + "self_attn.k_proj.bias", *rand(cfg.kv_size)
            yield p + "self_attn.v_proj.bias", *rand(cfg.kv_size)
        if mt in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3"):  # qk-norm
            yield p + "self_attn.q_norm.weight", *norm(cfg.head_dim)
            yield p + "self_attn.k_norm.weight", *norm(cfg.head_dim)
        yield p + "self_attn.o_proj.weight", *rand(h, cfg.q_size)
        if cfg.num_experts and cfg.moe_layers[layer]:
            e_i = cfg.moe_intermediate_size
            yield p + "mlp.gate.weight", *rand(cfg.num_experts, h)
            for e in range(cfg.num_experts):
                yield p + f"mlp.experts.{e}.gate_proj.weight", *rand(e_i, h)
                yield p + f"mlp.experts.{e}.up_proj.weight", *rand(e_i, h)
                yield p + f"mlp.experts.{e}.down_proj.weight", *rand(h, e_i)
            if cfg.shared_expert_intermediate_size:  # Qwen2-MoE
                s_i = cfg.shared_expert_intermediate_size
                yield p + "mlp.shared_expert.gate_proj.weight", *rand(s_i, h)
                yield p + "mlp.shared_expert.up_proj.weight", *rand(s_i, h)
                yield p + "mlp.shared_expert.down_proj.weight", *rand(h, s_i)
                yield p + "mlp.shared_expert_gate.weight", *rand(1, h)
        elif mt == "phi3":
            yield p + "mlp.gate_up_proj.weight", *rand(2 * i, h)
            yield p + "mlp.down_proj.weight", *rand(h, i)
        else:
            yield p + "mlp.gate_proj.weight", *rand(i, h)
            yield p + "mlp.up_proj.weight", *rand(i, h)
            yield p + "mlp.down_proj.weight", *rand(h, i)
        for name in norms:
            yield p + f"{name}.weight", *norm(h)
    yield "model.norm.weight", *norm(h)
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", *rand(cfg.vocab_size, h)
