"""`GrammarManager` with a fake compiler: compiles run off the calling thread, identical specs
share one compile, failures and timeouts fail only their requests, queued time does not count
against the timeout, aborts drop pending requests, masks cover unconstrained rows."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.manager import GrammarManager
from radixlm.runtime.errors import GrammarError


class FakeGrammar(Grammar):
    def __init__(self, word: int = 5) -> None:
        self.word = word
        self.tokens: list[int] = []

    def fill_mask(self, row: torch.Tensor) -> None:
        row.zero_()
        row[0] = self.word

    def accept(self, token_id: int) -> bool:
        self.tokens.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return False

    def jump_forward(self) -> str | None:
        return None

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n :]

    @property
    def max_rollback(self) -> int:
        return 8

    @property
    def num_accepted(self) -> int:
        return len(self.tokens)

    def copy(self) -> FakeGrammar:
        return FakeGrammar(self.word)


class FakeCompiler(GrammarCompiler):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.release = threading.Event()

    def validate(self, spec: GrammarSpec) -> None:
        pass

    def compile(self, spec: GrammarSpec) -> Grammar:
        self.calls.append(str(spec.value))
        self.threads.add(threading.current_thread().name)
        if str(spec.value).startswith("block"):
            self.release.wait(120)  # released by the test
        if spec.value == "bad":
            raise GrammarError("cannot compile regex 'bad': nope", "regex")
        if spec.value == "boom":
            raise RuntimeError("internal")
        return FakeGrammar()


@dataclass
class FakeReq:
    rid: str
    grammar: Any = None
    sampling_params: Any = None


def wait_poll(mgr: GrammarManager, n: int, timeout: float = 10.0):
    ready, failed = [], []
    deadline = time.monotonic() + timeout
    while len(ready) + len(failed) < n and time.monotonic() < deadline:
        r, f = mgr.poll()
        ready += r
        failed += f
        time.sleep(0.01)
    return ready, failed


def manager(compiler: GrammarCompiler, timeout: float = 5.0) -> GrammarManager:
    return GrammarManager(compiler, 100, timeout, jump_forward=False)


def test_compiles_off_thread_and_dedupes():
    compiler = FakeCompiler()
    mgr = manager(compiler)
    spec = GrammarSpec("regex", "abc")
    reqs = [FakeReq("a"), FakeReq("b")]
    # NOTE: only poll() forgets a finished compile: the second submit shares the first's job
    # however fast it compiles (no delay needed to make them overlap).
    assert all(mgr.submit(r, spec) is None for r in reqs)
    ready, failed = wait_poll(mgr, 2)
    assert not failed and set(map(id, ready)) == set(map(id, reqs))
    assert compiler.calls == ["abc"]
    assert threading.current_thread().name not in compiler.threads
    assert reqs[0].grammar is not reqs[1].grammar  # each request owns its state
    assert not mgr.pending


def test_reasoning_requests_get_the_wrapper():
    """Both ways a grammar reaches a request (cache hit, compiled) wrap it when the sampling
    params carry `think_end_ids`; other requests get the backend's grammar itself."""
    from radixlm.runtime.constrained.reasoning import ReasoningGrammar
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    compiler = FakeCompiler()
    compiler.cached = lambda spec: FakeGrammar(7) if spec.value == "hot" else None  # type: ignore[attr-defined]
    mgr = manager(compiler)
    sp = SamplingParams.from_dict({"regex": "x", "think_end_ids": [5]})
    hot = mgr.submit(FakeReq("h", sampling_params=sp), GrammarSpec("regex", "hot"))
    assert isinstance(hot, ReasoningGrammar) and hot.end_ids == (5,) and hot.start_ids is None
    reqs = [FakeReq("a", sampling_params=sp), FakeReq("b", sampling_params=SamplingParams())]
    assert all(mgr.submit(r, GrammarSpec("regex", "cold")) is None for r in reqs)
    ready, failed = wait_poll(mgr, 2)
    assert not failed and len(ready) == 2 and isinstance(reqs[0].grammar, ReasoningGrammar)
    assert isinstance(reqs[1].grammar, FakeGrammar)


def test_failures_fail_only_their_request():
    mgr = manager(FakeCompiler())
    good, bad, boom = FakeReq("good"), FakeReq("bad"), FakeReq("boom")
    mgr.submit(good, GrammarSpec("regex", "ok"))
    mgr.submit(bad, GrammarSpec("regex", "bad"))
    mgr.submit(boom, GrammarSpec("regex", "boom"))
    ready, failed = wait_poll(mgr, 3)
    assert ready == [good]
    messages = dict((r.rid, m) for r, m in failed)
    assert messages["bad"] == "cannot compile regex 'bad': nope"
    assert "RuntimeError: internal" in messages["boom"]


def test_timeout_counts_compile_time_not_queue_time():
    compiler = FakeCompiler()
    mgr = manager(compiler, timeout=0.3)
    blocked = [FakeReq("blocked0"), FakeReq("blocked1"), FakeReq("blocked2")]
    mgr.submit(blocked[0], GrammarSpec("regex", "block1"))  # both workers block...
    mgr.submit(blocked[1], GrammarSpec("regex", "block1"))  # (same spec: the same compile)
    mgr.submit(blocked[2], GrammarSpec("regex", "block2"))
    queued = FakeReq("queued")
    mgr.submit(queued, GrammarSpec("regex", "fast"))
    # poll until the three blocked requests are reported (they never finish: only the timeout
    # can end them); the queued one waits behind the blocked workers all along
    ready, failed = wait_poll(mgr, 3, timeout=60)
    timed_out = {r.rid for r, m in failed if "grammar_compile_timeout=0.3" in m}
    assert timed_out == {"blocked0", "blocked1", "blocked2"}
    assert queued not in [*ready, *(r for r, _ in failed)]  # not started: no timeout yet
    compiler.release.set()
    ready, failed = wait_poll(mgr, 1)
    assert ready == [queued] and not failed


def test_abort_and_cache_hit():
    compiler = FakeCompiler()
    compiler.cached = lambda spec: FakeGrammar(7) if spec.value == "hot" else None  # type: ignore[attr-defined]
    mgr = manager(compiler)
    hot = mgr.submit(FakeReq("h"), GrammarSpec("regex", "hot"))
    assert isinstance(hot, FakeGrammar) and hot.word == 7 and not mgr.pending
    mgr.submit(FakeReq("x"), GrammarSpec("regex", "block-slow"))  # compiling until released
    assert [r.rid for r in mgr.abort("x")] == ["x"] and not mgr.pending
    compiler.release.set()


def test_mask_rows():
    mgr = manager(FakeCompiler())
    reqs = [FakeReq("a"), FakeReq("b", FakeGrammar(9)), FakeReq("c")]
    mask, rows = mgr.build_mask(reqs).dense()
    assert mask.shape == (3, 4) and mask.dtype == torch.int32
    assert (mask[0] == -1).all() and (mask[2] == -1).all()
    assert mask[1].tolist() == [9, 0, 0, 0] and rows.tolist() == [1]
    assert mgr.build_mask([FakeReq("z")]) is None
    _, rows = mgr.build_mask([reqs[1]]).dense()
    assert rows is None


class CheckingGrammar(FakeGrammar):
    """Allows tokens below `word` and can say so without a mask; counts its mask fills."""

    def __init__(self, word: int) -> None:
        super().__init__(word)
        self.fills = 0

    def fill_mask(self, row: torch.Tensor) -> None:
        self.fills += 1
        row.zero_()
        row[0] = (1 << self.word) - 1

    def allows(self, token_id: int) -> bool:
        return token_id < self.word


def test_lazy_mask_fills_only_refused_rows():
    """The greedy path's questions: a grammar with a check answers without its mask; one without
    (`allows` None) fills its row and reads the bit; only refused rows are filled for masking."""
    mgr = manager(FakeCompiler())
    cheap_ok, cheap_no, plain = CheckingGrammar(4), CheckingGrammar(4), FakeGrammar(0b1010)
    reqs = [FakeReq("a", cheap_ok), FakeReq("b"), FakeReq("c", cheap_no), FakeReq("d", plain)]
    mask = mgr.build_mask(reqs)
    import numpy as np

    assert mask.refused(np.array([3, 77, 9, 1])) == [2]  # token 1: bit 1 of 0b1010 is set
    assert mask.refused(np.array([3, 77, 9, 2])) == [2, 3]  # bit 2 is clear
    assert cheap_ok.fills == cheap_no.fills == 0  # answered without a mask
    bits = mask.host_bits([2])
    assert cheap_no.fills == 1 and cheap_ok.fills == 0 and bits[2, 0].item() == 0b1111
    mask.host_bits([2])
    assert cheap_no.fills == 1  # filled once per step
