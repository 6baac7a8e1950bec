"""Sampling parameters: SGLang's names and defaults, validated with messages that name the field.

`SamplingParams.from_dict` validates a user's dict once, in the tokenizer manager; the validated
value is a msgspec Struct that crosses to the scheduler inside `GenerateReq` (processes/io.py),
typed: validation leaves every field of its declared type (ints as int, numbers as float,
logit_bias keys as decimal strings), so the scheduler's decoder accepts it as is.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.sampling.compat_params import check_stop_regex, check_unsupported

_MAX_STOP_STRINGS = 256
_MAX_STOP_LEN = 2048


class SamplingParams(msgspec.Struct, omit_defaults=True):
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    # Python `re` patterns searched in the last STOP_REGEX_WINDOW tokens' text after each token.
    stop_regex: list[str] = msgspec.field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    choices: list[str] | None = None
    ebnf: str | None = None
    logit_bias: dict[str, float] | None = None
    # SGLang's names radixlm accepts only at their defaults (see compat_params.py).
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None
    # Reasoning-aware constraints (constrained/reasoning.py): the grammar starts after these ids.
    think_end_ids: list[int] | None = None
    think_start_ids: list[int] | None = None  # None: the output starts inside the reasoning
    stream_interval: int | None = None

    @classmethod
    def from_dict(
        cls, params: dict[str, Any] | None, vocab_size: int | None = None
    ) -> SamplingParams:
        """Validate a user dict. Unknown keys, wrong types and out-of-range values raise
        `InvalidRequestError` naming the field."""
        params = dict(params or {})
        if "sampling_seed" in params:  # SGLang's spelling
            params.setdefault("seed", params.pop("sampling_seed"))
        if "max_tokens" in params:
            raise InvalidRequestError(
                "unknown sampling parameter 'max_tokens' (did you mean 'max_new_tokens'?)",
                "max_tokens",
            )
        check_unsupported(params)
        known = set(cls.__struct_fields__)
        unknown = sorted(set(params) - known)
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s): {', '.join(unknown)}", unknown[0]
            )
        for key in [k for k, v in params.items() if v is None and k not in _NULLABLE]:
            params.pop(key)  # null means "default", as in SGLang's JSON API
        sp = cls(**params)
        sp._validate(vocab_size)
        return sp

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(kind, spec) of the output constraint, if any."""
        for kind in ("regex", "json_schema", "choices", "ebnf"):
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        return None

    def _validate(self, vocab_size: int | None) -> None:
        _int(self, "max_new_tokens", lo=0)
        _int(self, "min_new_tokens", lo=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequestError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})",
                "min_new_tokens",
            )
        _float(self, "temperature", lo=0.0, hi=100.0)
        _float(self, "top_p", lo=0.0, hi=1.0, lo_open=True)
        _int(self, "top_k", lo=-1, hi=2**31 - 1)  # NOTE: bounded: it crosses as an int64
        if self.top_k == 0:
            raise InvalidRequestError("top_k must be -1 (disabled) or >= 1, got 0", "top_k")
        _float(self, "min_p", lo=0.0, hi=1.0)
        _float(self, "frequency_penalty", lo=-2.0, hi=2.0)
        _float(self, "presence_penalty", lo=-2.0, hi=2.0)
        _float(self, "repetition_penalty", lo=0.0, hi=2.0, lo_open=True)
        _int(self, "n", lo=1, hi=128)
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
        ):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean", name)
        if self.seed is not None:
            _int(self, "seed", lo=-(2**63), hi=2**63 - 1)  # any int64, as OpenAI
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError(
                "stop must be a string or a list of non-empty strings", "stop"
            )
        if len(self.stop) > _MAX_STOP_STRINGS or any(len(s) > _MAX_STOP_LEN for s in self.stop):
            raise InvalidRequestError(
                f"stop: at most {_MAX_STOP_STRINGS} strings of at most {_MAX_STOP_LEN} characters",
                "stop",
            )
        if isinstance(self.stop_token_ids, int) and not isinstance(self.stop_token_ids, bool):
            self.stop_token_ids = [self.stop_token_ids]
        if not isinstance(self.stop_token_ids, list) or not all(
            _is_int(t) and t >= 0 and (vocab_size is None or t < vocab_size)
            for t in self.stop_token_ids
        ):
            raise InvalidRequestError(
                "stop_token_ids must be a list of token ids within the vocabulary", "stop_token_ids"
            )
        self.stop_regex = check_stop_regex(self.stop_regex)
        if len(self.stop_token_ids) > _MAX_STOP_STRINGS:
            raise InvalidRequestError("stop_token_ids: too many ids", "stop_token_ids")
        constraints = [k for k in ("regex", "json_schema", "choices", "ebnf") if getattr(self, k)]
        if len(constraints) > 1:
            raise InvalidRequestError(
                f"only one of regex, json_schema, choices, ebnf may be set (got {constraints})",
                constraints[1],
            )
        for name in ("regex", "json_schema", "ebnf"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"{name} must be a non-empty string", name)
        if self.choices is not None and (
            not isinstance(self.choices, list)
            or not self.choices
            or not all(isinstance(c, str) and c for c in self.choices)
        ):
            raise InvalidRequestError(
                "choices must be a non-empty list of non-empty strings", "choices"
            )
        for name in ("think_end_ids", "think_start_ids"):
            ids = getattr(self, name)
            if ids is not None and (
                not isinstance(ids, list)
                or not ids
                or not all(_is_int(t) and 0 <= t < (vocab_size or 1 << 62) for t in ids)
            ):
                raise InvalidRequestError(f"{name} must be a non-empty list of token ids", name)
        if self.think_start_ids is not None and self.think_end_ids is None:
            raise InvalidRequestError("think_start_ids needs think_end_ids", "think_start_ids")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidRequestError(
                    "logit_bias must be an object {token_id: bias}", "logit_bias"
                )
            for key, bias in self.logit_bias.items():
                if not str(key).lstrip("-").isdigit() or (
                    vocab_size is not None and not 0 <= int(key) < vocab_size
                ):
                    raise InvalidRequestError(f"logit_bias: invalid token id {key!r}", "logit_bias")
                if not _is_number(bias) or not -100.0 <= float(bias) <= 100.0:
                    raise InvalidRequestError(
                        "logit_bias values must be in [-100, 100]", "logit_bias"
                    )
            # NOTE: the wire type (token ids as strings, as in JSON; biases as floats).
            self.logit_bias = {str(int(k)): float(b) for k, b in self.logit_bias.items()}
        if self.stream_interval is not None:
            self.stream_interval = 1  # NOTE: check_unsupported let through only values == 1


_NULLABLE = {"seed", "regex", "json_schema", "choices", "ebnf", "logit_bias", "stream_interval",
             "structural_tag", "custom_params"}  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _int(sp: SamplingParams, name: str, lo: int | None = None, hi: int | None = None) -> None:
    v = getattr(sp, name)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
        setattr(sp, name, v)
    if not _is_int(v):
        raise InvalidRequestError(f"{name} must be an integer, got {v!r}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidRequestError(f"{name} must be {bound}, got {v}", name)


def _float(sp: SamplingParams, name: str, lo: float, hi: float, lo_open: bool = False) -> None:
    v = getattr(sp, name)
    if not _is_number(v):
        raise InvalidRequestError(f"{name} must be a finite number, got {v!r}", name)
    v = float(v)
    setattr(sp, name, v)
    if v > hi or v < lo or (lo_open and v == lo):
        bracket = "(" if lo_open else "["
        raise InvalidRequestError(f"{name} must be in {bracket}{lo}, {hi}], got {v}", name)
