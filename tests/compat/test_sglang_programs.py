"""SGLang's own program suite (`sglang.test.test_programs` from the pinned wheel, sglang==0.5.10.post1)
against one real `radixlm serve`: once through SGLang's frontend (`sgl.RuntimeEndpoint`), once
with `import radixlm as sgl` (the same source, radixlm's language).

Every upstream function runs unmodified. Where it takes `check_answer`, it gets False (the
135M default model does not know the answers); its structural assertions still run. Three
functions assert a factual answer with no such switch (few-shot capitals, 24 hours / 365 days, the
Linux founder's country): they must run to the end and fail, if at all, only on that answer line,
which is then reported as xfail with the model's answer; any other failure fails the test.
`test_hellaswag_select` reads a local HellaSwag-shaped file instead of downloading the data set.
`test_decode_json`'s requests carry a fixed sampling seed (see SEEDED).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import linecache
import traceback
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from compat import sglang_suite

from server_process import ServerProcess

# NOTE: a test extra: missing, it fails the tests, never skips them (issue 28.4).
assert importlib.util.find_spec("sglang"), (
    "SGLang's frontend: `./dev test` installs sglang==0.5.10.post1"
)


PROGRAMS = [
    "test_few_shot_qa",
    "test_mt_bench",
    "test_select",
    "test_decode_int",
    "test_decode_json_regex",
    "test_decode_json",
    "test_expert_answer",
    "test_tool_use",
    "test_react",
    "test_parallel_decoding",
    "test_parallel_encoding",
    "test_stream",
    "test_regex",
    "test_dtype_gen",
    "test_completion_speculative",
    "test_chat_completion_speculative",
    "test_gen_min_new_tokens",
    "test_image_qa",
    "test_hellaswag_select",
]
# NOTE: what is not run is left out of the parameters, each with its reason here, never skipped at
# run time (issue 28: no test skips on the CI machine except those marked gpu).
NOT_RUN = {
    "test_image_qa": "image input (sgl.image): radixlm serves text-only models",
}
# Programs upstream runs only on its OpenAI backend: SGLang's own RuntimeEndpoint lacks what they
# read (radixlm's RuntimeEndpoint has it: the radixlm run covers them).
# SGLang's OpenAI backend cannot stand in: it builds a tiktoken encoding, whose files tiktoken
# downloads at run time (CI has no network).
SGLANG_OPENAI_ONLY = {
    "test_completion_speculative": "SGLang's RuntimeEndpoint keeps no token_usage (upstream runs "
    "this program on its OpenAI backend only, which needs tiktoken's downloaded encodings); "
    "radixlm's RuntimeEndpoint does: see the radixlm run",
    "test_chat_completion_speculative": "SGLang's RuntimeEndpoint has no is_chat_model, so its "
    "executor fails on this program (upstream runs it on its OpenAI backend only, which needs "
    "tiktoken's downloaded encodings); see the radixlm run",
}


# Programs whose structural assertion the sampled tokens can break. `test_decode_json` samples each
# string of a JSON object at temperature 1 under `"[\w\d\s]*"` with max_new_tokens=64: the 135M
# model sometimes spends all 64 tokens inside a string (1 run in 40 here), the closing quote never
# comes, and `json.loads` fails by the model's draw, not the runtime's. Their requests carry a fixed
# `sampling_seed` (SGLang's field; the client's own parameters have none), so a run is reproducible;
# every value still has to match its regex for the JSON to parse.
SEEDED = {"test_decode_json": 0}


def seed_requests(monkeypatch: pytest.MonkeyPatch, frontend: str, seed: int) -> None:
    """Every request either frontend builds from now on carries `sampling_seed = seed`."""
    if frontend == "sglang":
        from sglang.lang.ir import SglSamplingParams

        srt_kwargs = SglSamplingParams.to_srt_kwargs
        monkeypatch.setattr(
            SglSamplingParams,
            "to_srt_kwargs",
            lambda self: {**srt_kwargs(self), "sampling_seed": seed},
        )
    else:
        from radixlm.lang.sampling import SamplingParams

        to_native = SamplingParams.to_native

        def seeded(self: SamplingParams) -> tuple[dict[str, Any], dict[str, Any]]:
            sampling, extra = to_native(self)
            return {**sampling, "sampling_seed": seed}, extra

        monkeypatch.setattr(SamplingParams, "to_native", seeded)


def hellaswag_fixture(path: Path) -> str:
    """A HellaSwag-shaped validation file (the fields upstream's `test_hellaswag_select` reads:
    activity_label, ctx, endings, label), 24 short made-up items: 20 shots, 24 questions."""
    actions = ["pours water", "kicks a ball", "opens a book", "paints a wall", "rides a bike",
               "plants a seed", "bakes bread", "ties a shoe"]  # fmt: skip
    lines = []
    for i in range(24):
        action = actions[i % len(actions)]
        endings = [f"then {action} again.", "then flies to the moon.", "then eats the sky.",
                   "then turns into a cloud."]  # fmt: skip
        label = i % 4
        endings[0], endings[label] = endings[label], endings[0]
        item = {"activity_label": action.split()[0].title(), "ctx": f"A person {action} and",
                "endings": endings, "label": label}  # fmt: skip
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# Upstream assertion lines that check a fact the small model does not know. Only these lines may
# xfail; anything else a program raises fails the test. (test_completion_speculative passes: the
# speculative request follows the program's format, interpreter/speculative.py.)
ANSWER_LINES = {
    "test_few_shot_qa": ('assert "washington" in', "assert answers == ["),
    "test_decode_int": ('assert int(ret["hours"]) == 24', 'assert int(ret["days"]) == 365'),
    "test_react": ('assert "finland" in answer',),
}


class LaunchedServer:
    """What `sgl.Runtime(...)` hands to `set_default_backend`: a server handle whose `endpoint`
    is the backend (upstream's test_gen_min_new_tokens reads `default_backend.endpoint`)."""

    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint


@pytest.fixture(scope="module")
def suites(compat_server: ServerProcess) -> dict[str, tuple[types.ModuleType, Any, Any]]:
    """frontend -> (the suite's module, its language module, the endpoint)."""
    import sglang

    import radixlm

    upstream = sglang_suite.load_test_programs()
    ours = sglang_suite.load_test_programs_as_radixlm()
    url = compat_server.base_url
    return {
        "sglang": (upstream, sglang, sglang.RuntimeEndpoint(url, api_key=compat_server.api_key)),
        "radixlm": (ours, radixlm, radixlm.RuntimeEndpoint(url, api_key=compat_server.api_key)),
    }


def _answer_line(exc: AssertionError, name: str, suite_file: str) -> str | None:
    """The upstream source line that raised `exc`, if it is one of `name`'s answer checks."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == suite_file]
    if not frames or frames[-1].lineno is None:
        return None
    line = linecache.getline(suite_file, frames[-1].lineno).strip()
    return line if line.startswith(ANSWER_LINES.get(name, ())) else None


FRONTENDS = ("sglang", "radixlm")
CASES = [
    (frontend, name)
    for frontend in FRONTENDS
    for name in PROGRAMS
    if name not in NOT_RUN and not (frontend == "sglang" and name in SGLANG_OPENAI_ONLY)
]


def test_every_upstream_program_is_run_or_left_out_with_a_reason() -> None:
    upstream = sglang_suite.load_test_programs()
    names = {n for n in dir(upstream) if n.startswith("test_") and callable(getattr(upstream, n))}
    assert names == set(PROGRAMS), names ^ set(PROGRAMS)
    assert set(NOT_RUN) | set(SGLANG_OPENAI_ONLY) <= set(PROGRAMS)
    for name in PROGRAMS:  # every program runs on one frontend at least
        assert name in NOT_RUN or any(n == name for _, n in CASES), name
    assert len(CASES) == 2 * len(PROGRAMS) - 2 * len(NOT_RUN) - len(SGLANG_OPENAI_ONLY)


@pytest.mark.slow
@pytest.mark.parametrize(("frontend", "name"), CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_upstream_program(
    frontend: str,
    name: str,
    suites: dict[str, Any],
    compat_server: ServerProcess,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    module, sgl, endpoint = suites[frontend]
    if name == "test_hellaswag_select":
        # NOTE: upstream downloads HellaSwag (CI has no network): its own download helper hands
        # it a local file of the same shape. Its last line compares two wall-clock latencies
        # (`< 1` s), which this project's tests never assert: the module's clock stands still,
        # so that line holds; the accuracy of both run_batch styles is compared for real.
        fixture = hellaswag_fixture(tmp_path / "hellaswag_val.jsonl")
        monkeypatch.setattr(module, "download_and_cache_file", lambda url, filename=None: fixture)
        monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    if name in SEEDED:
        seed_requests(monkeypatch, frontend, SEEDED[name])
    # NOTE: the upstream suite reads the backend from the language's global config; a server
    # handle (as sgl.Runtime gives) except where the program reads `backend.token_usage`.
    sgl.set_default_backend(
        endpoint if name == "test_completion_speculative" else LaunchedServer(endpoint)
    )
    program: Callable[..., Any] = getattr(module, name)
    kwargs = (
        {"check_answer": False} if "check_answer" in inspect.signature(program).parameters else {}
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            program(**kwargs)
        # NOTE: SGLang's executor reports a failed program only as a warning; radixlm's raises.
        failed = [str(w.message) for w in caught if "Error in stream_executor" in str(w.message)]
        assert not failed, failed[0][-2000:]
    except AssertionError as exc:
        line = _answer_line(exc, name, module.__file__)
        if line is None:
            raise
        compat_server.wait_idle_and_check_kv()
        pytest.xfail(f"the default model's answer decides this check: `{line}` ({exc})"[:400])
    compat_server.wait_idle_and_check_kv()
