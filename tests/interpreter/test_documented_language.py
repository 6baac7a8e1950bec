"""What docs/language.md promises that no other test runs: `s.copy()` (fork(1) + join as a
context manager), `rl.get_server_info()` / `rl.flush_cache()` on the default backend, and
`gen(dtype=float)` / `gen(dtype=bool)` (SGLang's regexes, checked at temperature 0.8 over 8
seeds), on the real engine."""

from __future__ import annotations

import re

import pytest

import radixlm.interpreter.api as rl
from radixlm.interpreter.engine_backend import EngineBackend


@pytest.fixture(scope="module")
def backend(engine):
    return EngineBackend.for_engine(engine)


def test_copy_continues_a_branch_and_leaves_the_state_alone(backend):
    @rl.function
    def prog(s):
        s += "Q: Name a color.\nA:"
        with s.copy() as branch:
            branch += rl.gen("draft", max_tokens=4, temperature=0)
            text_inside = branch.text()
        s["inside"] = text_inside

    state = prog.run(backend=backend)
    assert state.error() is None, state.error()
    assert state.text() == "Q: Name a color.\nA:"  # the copy's text did not come back
    assert state["inside"].startswith("Q: Name a color.\nA:")
    assert len(state["inside"]) > len(state.text())


def test_server_info_and_flush_cache_on_the_default_backend(backend, engine):
    previous = rl.global_config.default_backend
    rl.set_default_backend(backend)
    try:
        info = rl.get_server_info()
        assert info["model_name"] == engine.get_server_info()["model_name"]
        assert info["max_total_num_tokens"] > 0
        rl.flush_cache()
        assert engine.get_server_info()["evictable_slots"] == 0
    finally:
        rl.global_config.default_backend = previous


# (dtype, its regex, the regex of its prefixes: what an answer cut by max_tokens may be)
DTYPES = [
    (float, rl.REGEX_FLOAT, r"[-+]?[0-9]*\.?[0-9]*[ \n]*"),
    (bool, rl.REGEX_BOOL, r"|T|Tr|Tru|True|F|Fa|Fal|Fals|False"),
]


@pytest.mark.parametrize(("dtype", "regex", "prefix"), DTYPES, ids=["float", "bool"])
def test_gen_dtype_float_and_bool(backend, dtype, regex, prefix):
    @rl.function
    def prog(s, i):
        s += f"Q{i}: Is the sky blue? How many degrees is a warm day?\nA: "
        s += rl.gen("v", dtype=dtype, max_tokens=16)

    states = prog.run_batch([{"i": i} for i in range(8)], temperature=0.8, backend=backend)
    stopped = 0
    for st in states:
        assert st.error() is None, st.error()
        if st.get_meta_info("v")["finish_reason"]["type"] == "stop":
            assert re.fullmatch(regex, st["v"]), st["v"]
            stopped += 1
        else:  # cut by max_tokens (a float's digits are unbounded): a prefix of the language
            assert re.fullmatch(prefix, st["v"]), st["v"]
    assert stopped >= 1, [st["v"] for st in states]
