"""`@function`: a generation program, and its `run` / `run_batch` / `bind` / `trace` entry points.

A program is a Python function whose first parameter is the state `s`. `Function` wraps it and
collects the run-level sampling defaults; running is the interpreter's job.

# NOTE: `radixlm.interpreter` is imported inside the methods, never at module level: `lang` must
# stay importable on its own (dependencies point lang <- interpreter), exactly as SGLang's
# `SglFunction.run` imports its interpreter lazily.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from radixlm.lang.sampling import RUN_DEFAULTS, SamplingParams, normalize_stop
from radixlm.lang.tracer import StopTracing, is_tracing

if TYPE_CHECKING:
    from radixlm.interpreter.state import ProgramState
    from radixlm.lang.tracer import TracerState


def _run_defaults(
    max_new_tokens: int,
    stop: str | Sequence[str],
    stop_token_ids: Sequence[int],
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    frequency_penalty: float,
    presence_penalty: float,
    ignore_eos: bool,
    return_logprob: bool | None,
    logprob_start_len: int | None,
    top_logprobs_num: int | None,
    return_text_in_logprobs: bool | None,
) -> SamplingParams:
    return RUN_DEFAULTS.merge(
        SamplingParams(
            max_new_tokens=max_new_tokens,
            stop=normalize_stop(stop),
            stop_token_ids=tuple(stop_token_ids),
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
    )


class Function:
    """A generation program (what `@radixlm.function` returns)."""

    def __init__(
        self,
        func: Callable[..., Any],
        bind_arguments: Mapping[str, Any] | None = None,
        num_api_spec_tokens: int | None = None,
    ) -> None:
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise TypeError(f"a program's first parameter must be the state `s`: {func.__name__}")
        self.func = func
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__
        self.__wrapped__ = func
        self.bind_arguments: dict[str, Any] = dict(bind_arguments or {})
        if num_api_spec_tokens is not None and (
            not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1
        ):
            raise ValueError(
                f"num_api_spec_tokens must be an int >= 1, got {num_api_spec_tokens!r}"
            )
        # Speculative execution (see interpreter/speculative.py); None: off.
        self.num_api_spec_tokens = num_api_spec_tokens
        self.arg_names = [p.name for p in params[1:]]
        self.arg_defaults = [p.default for p in params[1:] if p.default is not p.empty]

    def __repr__(self) -> str:
        return f"<radixlm.function {self.__name__}({', '.join(self.arg_names)})>"

    def bind(self, **kwargs: Any) -> Function:
        """A copy with some arguments fixed (they are constants for tracing, too)."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.__name__}() has no argument(s) {sorted(unknown)}")
        return Function(self.func, {**self.bind_arguments, **kwargs}, self.num_api_spec_tokens)

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        stop: str | Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: Any = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once; keyword arguments not listed here go to the program.

        Without `stream`, returns when the program has finished (raising its error, if any);
        with `stream=True`, returns at once and the state fills in (`text_iter`, `display`).
        """
        from radixlm.interpreter.runner import run_program

        defaults = _run_defaults(
            max_new_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p,
            frequency_penalty, presence_penalty, ignore_eos, return_logprob,
            logprob_start_len, top_logprobs_num, return_text_in_logprobs,
        )  # fmt: skip
        return run_program(self, backend, args, kwargs, defaults, stream=stream)

    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        max_new_tokens: int = 128,
        stop: str | Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        precache: bool | None = None,
        generator_style: bool = False,
    ) -> list[ProgramState] | Iterable[ProgramState]:
        """Run the program once per argument dict (or tuple), concurrently.

        Every program runs to its end even when others fail; a failed program's state holds the
        error (`state.error()`), and reading one of its missing variables raises it. Before the
        fan-out the shared constant prefix (found by tracing) is cached once, unless
        `precache=False` (default: `global_config.enable_precache_with_tracing`).
        """
        from radixlm.interpreter.runner import run_program_batch

        defaults = _run_defaults(
            max_new_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p,
            frequency_penalty, presence_penalty, ignore_eos, return_logprob,
            logprob_start_len, top_logprobs_num, return_text_in_logprobs,
        )  # fmt: skip
        return run_program_batch(
            self,
            backend,
            [self._as_kwargs(a) for a in batch_kwargs],
            defaults,
            num_threads=num_threads,
            progress_bar=progress_bar,
            precache=precache,
            generator_style=generator_style,
        )

    def _as_kwargs(self, arguments: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
        if isinstance(arguments, Mapping):
            return dict(arguments)
        values = list(arguments)
        required = len(self.arg_names) - len(self.arg_defaults)
        if not required <= len(values) <= len(self.arg_names):
            raise TypeError(
                f"{self.__name__}() takes {required}..{len(self.arg_names)} arguments, got {values!r}"
            )
        return dict(zip(self.arg_names, values, strict=False))

    def trace(self, *, backend: Any = None, **kwargs: Any) -> TracerState:
        """Record what the program appends, with placeholders for the arguments not given."""
        from radixlm.interpreter.config import resolve_backend
        from radixlm.lang.tracer import trace_program

        template = resolve_backend(backend).chat_template
        return trace_program(self, template, kwargs)

    def cache(self, backend: Any = None) -> str:
        """Send the program's constant prefix to the backend's cache now; returns the prefix."""
        from radixlm.interpreter.runner import cache_program

        return cache_program(self, backend)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        if is_tracing():
            # A program called inside a traced program: its output is not a constant prefix.
            raise StopTracing
        return self.run(*args, **kwargs)


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator: turn `def prog(s, ...)` into a runnable generation program.

    Usable bare (`@function`) or with options (`@function(num_api_spec_tokens=64)`).
    `num_api_spec_tokens` (SGLang's option): speculative execution. The program's first `gen`
    outside a chat role asks for that many tokens at once, with no stop string; it and the
    following `gen`s take their values from that text as long as the program's own constant text
    matches it (see interpreter/speculative.py), so one request serves several `gen`s.
    """
    if func is not None:
        return Function(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: Function(f, num_api_spec_tokens=num_api_spec_tokens)
