"""Loading: a HF repo id from a (fake) local Hugging Face cache, with no network; a clear error when
it is not cached; `dummy` weights for every registered architecture."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import TINY, save_tiny

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.default_model import ModelNotFoundError
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11]


def _runner(path: str, **kw) -> ModelRunner:
    args = ServerArgs(model_path=path, max_total_tokens=128, max_running_requests=2, **kw)
    return ModelRunner(args, resolve_model(path, kw.get("load_format", "auto")))


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A fake HF hub cache holding `tiny-org/Tiny-Qwen3` at revision `abc123` (refs/main), plus
    an older snapshot that must not be picked."""
    root = tmp_path / "hub" / "models--tiny-org--Tiny-Qwen3"
    old = root / "snapshots" / "0ld"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    model = save_tiny("qwen3", str(root / "snapshots" / "abc123"))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return str(root / "snapshots" / "abc123"), model


def test_repo_id_resolves_from_the_local_cache(hf_cache) -> None:
    snapshot, hf = hf_cache
    source = resolve_model("tiny-org/Tiny-Qwen3")
    assert source.path == snapshot and source.config.architecture == "Qwen3ForCausalLM"
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    torch.testing.assert_close(runner_logits(_runner("tiny-org/Tiny-Qwen3"), IDS), ref)


def test_engine_takes_a_cached_repo_id(hf_cache) -> None:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(
        model_path="tiny-org/Tiny-Qwen3", skip_tokenizer_init=True, max_total_tokens=128
    )
    try:
        out = engine.generate(input_ids=IDS, sampling_params={"max_new_tokens": 3})
        assert len(out["output_ids"]) == 3
        assert engine.model_name == "tiny-org/Tiny-Qwen3"
    finally:
        engine.shutdown()


def test_uncached_repo_id_names_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache") as err:
        resolve_model("Qwen/Qwen3-0.6B")
    assert os.path.join(str(tmp_path), "models--Qwen--Qwen3-0.6B") in str(err.value)


@pytest.mark.parametrize("name", list(TINY))
def test_dummy_weights_for_every_architecture(tmp_path, name) -> None:
    """A registered config alone runs with `dummy` weights: every tensor present exactly once
    (the loader counts them), deterministic, finite logits."""
    import json

    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**TINY[name]).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = runner_logits(_runner(str(tmp_path), load_format="dummy"), IDS)
    b = runner_logits(_runner(str(tmp_path), load_format="dummy"), IDS)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)
