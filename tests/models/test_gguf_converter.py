"""An independent check of the GGUF loader: llama.cpp's own converter (`convert_hf_to_gguf.py`, run
as a subprocess, see tests/llama_cpp_converter.py) writes the GGUF files of the tiny checkpoints of
every architecture radixlm loads from GGUF; radixlm loads them, and must give the logits and the
greedy tokens of transformers running the ORIGINAL checkpoint folders.

(tests/models/test_gguf.py writes its files with our own belief of that layout: a wrong belief
would pass on both sides there. Here the layout is llama.cpp's: tensor names, 3-D expert tensors,
Gemma's `1 + w` norms, Phi-3's fused projections and LongRoPE factors, Llama 3's `rope_freqs`,
q/k row permutations, metadata keys.)

A few tiny configs are changed where llama.cpp itself does not carry a setting into GGUF (so that
the file and the checkpoint mean the same model); each is said at its case."""

from __future__ import annotations

import pytest
import torch
from gguf_writer import ARCH, EXTRA_KEYS, MISSING_KEYS, write_gguf
from llama_cpp_converter import (
    BPE_VOCAB,
    convert,
    write_bpe_tokenizer,
    write_sentencepiece_tokenizer,
)
from tiny_models import LLAMA_FAMILY, TINY, save_tiny

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.gguf_file import GGUFFile
from radixlm.runtime.models.hf_reference import HFReference
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11, 2, 3, 255, 0, 9, 31, 200]
MAX_NEW = 8
F32_TOL = 1e-4  # as tests/models/test_gguf.py
# the Q8_0 block kernels (radixlm's default for a Q8_0 file on CPU) quantise the activations too,
# as llama.cpp does: ~0.03 seen here on logits of std ~0.6 (a layout or de-quantisation bug moves
# them by far more; the dense path is held to F32_TOL)
Q8_ACTIVATION_TOL = 0.1
GGML_Q8_0 = 8

# name -> (tiny checkpoint, config overrides, tokenizer): "bpe" where the converter takes only a
# byte-level BPE vocabulary it recognises (the default model's, so 49152 tokens), else "spm".
CASES: dict[str, tuple[str, dict, str]] = {
    "llama": ("llama", {}, "spm"),
    "llama3_rope": ("llama3_rope", {}, "spm"),  # the converter writes `rope_freqs.weight`
    # llama.cpp runs a Mistral (and a Mixtral) as a `llama`: no sliding window
    "mistral": ("mistral", {"sliding_window": None}, "spm"),
    "qwen2": ("qwen2", {}, "spm"),
    # llama.cpp's qwen3 has no sliding window (the released Qwen3 models use none)
    "qwen3": ("qwen3", {"use_sliding_window": False}, "spm"),
    # its qwen3moe has no dense layers and always renormalises the top-k weights (it writes
    # no `expert_weights_norm`), as the released models do
    "qwen3_moe": (
        "qwen3_moe",
        {"mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": BPE_VOCAB},
        "bpe",
    ),
    # its qwen2moe: no dense layers, no sliding window
    "qwen2_moe": (
        "qwen2_moe",
        {"mlp_only_layers": [], "use_sliding_window": False, "vocab_size": BPE_VOCAB},
        "bpe",
    ),
    "mixtral": ("mixtral", {"sliding_window": None}, "spm"),  # a `llama` with experts
    # llama.cpp scales Gemma's queries by 1/sqrt(head_dim) (no GGUF key says otherwise)
    "gemma2": ("gemma2", {"query_pre_attn_scalar": TINY["gemma2"]["head_dim"]}, "spm"),
    # the converter writes no window pattern: llama.cpp's default, every 6th layer global
    "gemma3": (
        "gemma3",
        {
            "sliding_window_pattern": 6,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        },
        "spm",
    ),
    "phi3": ("phi3", {}, "spm"),
    "phi4_mini": ("phi4_mini", {}, "spm"),
}
# what the file says the model is, where not the checkpoint's architecture
GGUF_ARCH = {"mistral": "LlamaForCausalLM"}
# Q8_0 (the converter's own quantiser): 3-D expert tensors with permuted q/k rows; fused qkv;
# a shared expert (its down projection in F16: rows of 48)
JOBS = [(name, "f32") for name in CASES] + [(n, "q8_0") for n in ("mixtral", "phi3", "qwen2_moe")]
# the matrices llama.cpp's converter keeps in F32 in a Q8_0 file: the routers
F32_MATRICES = ("mlp.gate.weight", "shared_expert_gate.weight")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[tuple[str, str], tuple[str, str]]:
    """(case, outtype) -> (checkpoint folder, GGUF file written by llama.cpp's converter)."""
    root = tmp_path_factory.mktemp("llama_cpp")
    folders = {}
    for name, (tiny, overrides, tokenizer) in CASES.items():
        folder = str(root / name)
        save_tiny(tiny, folder, **overrides)
        (write_bpe_tokenizer if tokenizer == "bpe" else write_sentencepiece_tokenizer)(folder)
        folders[name] = folder
    out = {job: (folders[job[0]], str(root / f"{job[0]}.{job[1]}.gguf")) for job in JOBS}
    convert([(folder, job[1], path) for job, (folder, path) in out.items()], str(root / "log"))
    return out


def _greedy(runner: ModelRunner, ids: list[int], n: int) -> list[int]:
    ids, out = list(ids), []
    for _ in range(n):
        out.append(int(runner_logits(runner, ids)[-1].argmax()))
        ids.append(out[-1])
    return out


@torch.no_grad()
def _round_like_q8_0(model: torch.nn.Module) -> None:
    """The weights a Q8_0 file holds: each matrix through `gguf.quants` (llama.cpp's reference
    Q8_0, blocks of 32 along a row; the converter falls back to F16 for rows of another length).
    Row permutations, splits and fusions commute with it."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q8 = GGMLQuantizationType.Q8_0
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.endswith(F32_MATRICES):
            continue
        if p.shape[-1] % 32:
            p.copy_(p.half().float())
        else:
            w = p.numpy()
            p.copy_(torch.from_numpy(dequantize(quantize(w, q8), q8).reshape(w.shape)))


@pytest.mark.parametrize(("name", "outtype"), JOBS)
def test_llama_cpp_converted_gguf_matches_transformers(converted, name, outtype) -> None:
    from transformers import AutoModelForCausalLM

    folder, path = converted[name, outtype]
    tiny = CASES[name][0]
    source = resolve_model(path)
    assert source.load_format == "gguf" and source.gguf is not None
    arch = (TINY.get(tiny) or LLAMA_FAMILY[tiny])["architectures"][0]
    assert source.config.architecture == GGUF_ARCH.get(name, arch)
    types = {t.ggml_type for t in source.gguf.tensors.values()}
    assert (GGML_Q8_0 in types) == (outtype == "q8_0"), types

    def run(**kwargs) -> ModelRunner:
        args = ServerArgs(model_path=path, max_total_tokens=256, max_running_requests=2, **kwargs)
        return ModelRunner(args, source)

    def hf_logits() -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([IDS])).logits[0]

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = HFReference(hf, None, {}, None).greedy(IDS, MAX_NEW)
    if outtype == "q8_0":
        _round_like_q8_0(hf)
        # the file de-quantised by radixlm (dense fp32): exactly the rounded checkpoint
        dense = runner_logits(run(dtype="float32"), IDS)
        torch.testing.assert_close(dense, hf_logits(), rtol=F32_TOL, atol=F32_TOL)
    runner = run()  # the default: on CPU a Q8_0 file runs the Q8_0 block kernels
    tol = F32_TOL if outtype == "f32" else Q8_ACTIVATION_TOL
    torch.testing.assert_close(runner_logits(runner, IDS), hf_logits(), rtol=tol, atol=tol)
    assert _greedy(runner, IDS, MAX_NEW) == expected  # the tokens of the true weights


@pytest.mark.parametrize("name", [name for name in CASES if name in ARCH])
def test_our_gguf_writer_agrees_with_llama_cpps_converter(converted, tmp_path, name) -> None:
    """tests/gguf_writer.py (what tests/models/test_gguf.py loads) writes what llama.cpp's
    converter writes from the same checkpoint: the same tensors, bit for bit, and the same
    metadata, but for the keys it adds (`EXTRA_KEYS`) or leaves out (`MISSING_KEYS`)."""
    from transformers import AutoModelForCausalLM

    folder, path = converted[name, "f32"]
    write_gguf(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
        name,
        str(tmp_path / "ours.gguf"),
    )
    ours, theirs = GGUFFile(str(tmp_path / "ours.gguf")), GGUFFile(path)
    assert ours.architecture == theirs.architecture
    prefix = ours.architecture + "."

    def keys(f: GGUFFile) -> dict:
        return {k[len(prefix) :]: v for k, v in f.metadata.items() if k.startswith(prefix)}

    ours_md, theirs_md = keys(ours), keys(theirs)
    assert set(ours_md) - set(theirs_md) <= set(EXTRA_KEYS)
    assert set(theirs_md) - set(ours_md) <= set(MISSING_KEYS)
    for key in set(ours_md) & set(theirs_md):
        value = theirs_md[key]  # NOTE: a float of theirs may be a float32 of ours, or the reverse
        assert ours_md[key] == (
            pytest.approx(value, rel=1e-6) if isinstance(value, float) else value
        ), key
    assert sorted(ours.tensors) == sorted(theirs.tensors)
    for tname, tensor in theirs.tensors.items():
        mine = ours.tensors[tname]
        assert (mine.shape, mine.ggml_type) == (tensor.shape, tensor.ggml_type), tname
        assert torch.equal(mine.to_torch(), tensor.to_torch()), tname


def test_hf_reference_of_a_llama3_rope_gguf(converted) -> None:
    """`HFReference` (benchmarks' peer, built from our loader's tensors and config) runs a GGUF's
    `rope_freqs` too: transformers has no rope type for bare frequency divisors."""
    from transformers import AutoModelForCausalLM

    folder, path = converted["llama3_rope", "f32"]
    ref = HFReference.load(path)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ours, theirs = (m(torch.tensor([IDS])).logits[0] for m in (ref.model, hf))
    torch.testing.assert_close(ours, theirs, rtol=F32_TOL, atol=F32_TOL)


def test_tokenizer_of_a_converted_bpe_vocabulary(converted) -> None:
    """radixlm's tokenizer built from a GGUF's byte-level BPE vocabulary (tokens, merges, types
    and `tokenizer.ggml.pre` as llama.cpp's converter writes them) encodes like the original."""
    from transformers import AutoTokenizer

    from radixlm.runtime.frontend.tokenizer import load_tokenizer

    folder, path = converted["qwen3_moe", "f32"]
    ours, theirs = load_tokenizer(path), AutoTokenizer.from_pretrained(folder)
    texts = [
        "Hello world 12345, 3.14!",
        "  leading spaces,\nnew lines\tand tabs",
        "émoji 🚀 and ünïcode",
        "<|im_start|>user\nhi<|im_end|>",
    ]
    for text in texts:
        expected = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours(text, add_special_tokens=False)["input_ids"] == expected, text
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token)
