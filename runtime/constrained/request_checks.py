"""The tokenizer manager's grammar checks of a request's constraint (before anything is sent to
the scheduler), and the path that keeps large ones off the event loop.

- `check_constraint(sp, backend, whitespace)`: the grammar backend's cheap checks (no token masks are built),
  raising `GrammarError` naming the problem. The verdict (pass, or the error) is cached per
  (spec, backend, whitespace pattern), so a spec is checked once however often it is sent.
- `precheck_large_constraints(backend, whitespace, vocab_size, params)`: awaited by the request path before its
  synchronous validation. A constraint of at least `LARGE_CONSTRAINT_CHARS` characters (a 2 MB
  SchemaStore schema takes ~250 ms to check) is checked in a worker thread of `check_pool()`, so
  the event loop keeps streaming other requests meanwhile; the synchronous `check_constraint`
  that follows finds its verdict in the cache. Small constraints are checked inline (a thread
  hop would cost more than the check).

Threading: `check_constraint` runs on the event loop or on the pool's threads; the cache is
`functools.lru_cache` (thread-safe) and the backends' checks are pure.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.runtime.constrained.base import CONSTRAINT_KINDS, GrammarSpec
from radixlm.runtime.errors import GrammarError

LARGE_CONSTRAINT_CHARS = 32_768
CHECK_WORKERS = 2

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_pending = 0  # large checks handed to the pool and not yet done (under `_changed`)
_changed = threading.Condition()


def check_pool() -> ThreadPoolExecutor:
    """The process's pool for large constraint checks (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(CHECK_WORKERS, thread_name_prefix="radixlm-check")
        return _pool


def _check_spec(spec: GrammarSpec, backend: str, whitespace: str | None) -> None:
    if backend == "llguidance":
        from radixlm.runtime.constrained.llguidance_specs import check_spec_llguidance

        check_spec_llguidance(spec, whitespace)
        return
    if backend == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_specs import check_spec_xgrammar

        check_spec_xgrammar(spec, whitespace)
        return
    from radixlm.runtime.constrained.patterns import check_spec
    from radixlm.runtime.constrained.regex_guard import check_regex_size, check_schema_patterns

    check_spec(spec, whitespace)
    # NOTE: after the syntax checks; bounds the automaton (regex_guard)
    if spec.kind == "regex":
        assert isinstance(spec.value, str)
        check_regex_size(spec.value)
    elif spec.kind == "json_schema":
        assert isinstance(spec.value, str)
        check_schema_patterns(spec.value)


# NOTE: keys hold the spec text (up to the request body limit): a small cache bounds the memory
# a client sending many distinct large schemas can pin.
@functools.lru_cache(maxsize=128)
def _verdict(spec: GrammarSpec, backend: str, whitespace: str | None) -> tuple[str, str] | None:
    """None when the spec passes, else the (message, field) of its GrammarError."""
    try:
        _check_spec(spec, backend, whitespace)
    except GrammarError as exc:
        return str(exc), exc.field or spec.kind
    return None


def check_constraint(sp: Any, backend: str, whitespace: str | None) -> None:
    """Raise GrammarError unless the constraint of `sp` (a SamplingParams) passes the checks of
    grammar `backend` (with the server's JSON `whitespace` pattern); no-op without one."""
    constraint = sp.constraint
    if constraint is None:
        return
    spec = GrammarSpec.from_constraint(*constraint)
    verdict = _verdict(spec, backend, whitespace)
    if verdict is not None:
        raise GrammarError(*verdict)


def constraint_chars(params: Any) -> int:
    """Characters of the constraint in a raw sampling-params dict (0 if none or malformed)."""
    if not isinstance(params, dict):
        return 0
    total = 0
    for kind in CONSTRAINT_KINDS:
        value = params.get(kind)
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, list):
            total += sum(len(v) for v in value if isinstance(v, str))
    return total


def _check_params(
    params: dict, vocab_size: int | None, backend: str, whitespace: str | None
) -> None:
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    check_constraint(SamplingParams.from_dict(params, vocab_size), backend, whitespace)


def pending_checks() -> int:
    """Large checks handed to the pool (queued or running) and not finished yet."""
    with _changed:
        return _pending


def wait_pending(count: int, timeout: float) -> bool:
    """Block until `pending_checks() == count` (False if `timeout` seconds pass first)."""
    with _changed:
        return _changed.wait_for(lambda: _pending == count, timeout)


def _add_pending(delta: int) -> None:
    global _pending
    with _changed:
        _pending += delta
        _changed.notify_all()


async def precheck_large_constraints(
    backend: str, whitespace: str | None, vocab_size: int | None, params: list[Any]
) -> None:
    """Check each large constraint of `params` (raw sampling-params dicts) in a worker thread.
    Raises what the synchronous validation would raise for that request."""
    loop = asyncio.get_running_loop()
    for p in params:
        if constraint_chars(p) >= LARGE_CONSTRAINT_CHARS:
            _add_pending(1)
            try:
                await loop.run_in_executor(
                    check_pool(), _check_params, p, vocab_size, backend, whitespace
                )
            finally:
                _add_pending(-1)
