"""Shared fixtures: engines (started once per configuration and reused), the transformers
reference model of the default model, the KV-accounting check after every engine test, and
`main_server` (one `radixlm serve` for the session: the server and interpreter tests use it)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from server_process import MAIN_API_KEY, MAIN_BODY_LIMIT, ServerProcess
from tests_helpers import ENGINES, get_engine, wait_idle_and_check

# Keep torch in test processes from oversubscribing the 2-core CI machine next to the engine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# NOTE: on CPU, Triton kernels run only in its interpreter, and TRITON_INTERPRET must be set before
# any `@triton.jit` kernel is created: here, before any test module (of any folder) imports one.
def _has_cuda() -> bool:
    import torch  # NOTE: after OMP_NUM_THREADS is set

    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _engine_invariants() -> Iterator[None]:
    """After every test: each live shared engine is idle with exact KV accounting."""
    yield
    for engine in list(ENGINES.values()):
        wait_idle_and_check(engine)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    for engine in ENGINES.values():
        engine.shutdown()
    ENGINES.clear()


@pytest.fixture(scope="session")
def engine() -> Any:
    """The default engine: SmolLM2-135M-Instruct on CPU, radix cache on."""
    return get_engine()


@pytest.fixture(scope="session")
def fp32_engine() -> Any:
    """The default model in fp32 (its GGUF file de-quantised): the path whose greedy tokens and
    logprobs equal transformers' (the default CPU mode computes the Q4_1 blocks on Q8-quantised
    activations, as llama.cpp does: within the quality gate, not token for token)."""
    return get_engine(dtype="float32")


@pytest.fixture(scope="session")
def outlines_engine() -> Any:
    """The default engine on the alternative grammar backend (`grammar_backend="outlines"`)."""
    return get_engine(grammar_backend="outlines")


@pytest.fixture(scope="session")
def xgrammar_engine() -> Any:
    """The default engine on the XGrammar grammar backend (`grammar_backend="xgrammar"`)."""
    return get_engine(grammar_backend="xgrammar")


@pytest.fixture(scope="session")
def hf_reference() -> Any:
    """transformers' LlamaForCausalLM holding exactly the default model's (de-quantized) weights."""
    from radixlm.runtime.models.hf_reference import HFReference

    return HFReference.default()


@pytest.fixture(scope="session")
def main_server() -> Iterator[ServerProcess]:
    """The server shared by the API modules (native, OpenAI, security): API key on, so every
    test also proves that authorized requests work; a body limit above the long-prompt tests."""
    server = ServerProcess("--max-request-body-bytes", str(MAIN_BODY_LIMIT), api_key=MAIN_API_KEY)
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
    """A kernelspec that runs this interpreter (so the kernel sees the same radixlm install)."""
    name = "radixlm-test"
    spec_dir = tmp_path / "jupyter" / "kernels" / name
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "radixlm test",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return name
