"""Process-wide settings of the interpreter: the default backend and a few switches.

Ownership: `global_config` is one module-level object. `set_default_backend` replaces its backend
under a lock; readers take the reference once per run (a run keeps the backend it started with).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from radixlm.interpreter.backend import Backend
from radixlm.lang.errors import NoBackendError


@dataclass
class GlobalConfig:
    """SGLang's `global_config`, reduced to what radixlm uses."""

    default_backend: Any = None  # a Backend, or a server handle with an `endpoint` Backend
    # Cache the traced constant prefix of a batch before the fan-out (`run_batch(precache=...)`).
    enable_precache_with_tracing: bool = True
    # A prefix shorter than this (in characters) is not worth a cache call (SGLang's threshold).
    precache_min_chars: int = 64


global_config = GlobalConfig()
_lock = threading.Lock()


def as_backend(obj: Any) -> Backend:
    """A `Backend` as is; an in-process `radixlm.Engine` wrapped in an `EngineBackend`; a handle
    of a launched server with an `endpoint` backend (SGLang's `Runtime`) as its endpoint."""
    if isinstance(obj, Backend):
        return obj
    if isinstance(getattr(obj, "endpoint", None), Backend):
        return obj.endpoint
    # NOTE: duck-typed so this module never imports the runtime (and torch) itself.
    if hasattr(obj, "generate") and hasattr(obj, "tokenizer"):
        from radixlm.interpreter.engine_backend import EngineBackend

        return EngineBackend.for_engine(obj)
    raise TypeError(f"not a radixlm backend or Engine: {obj!r}")


def set_default_backend(backend: Any) -> None:
    """Use `backend` (a `Backend`, or an `Engine`) for programs run without `backend=`."""
    wrapped = as_backend(backend)
    # NOTE: a server handle is kept as given (SGLang programs read
    # `global_config.default_backend.endpoint`); `resolve_backend` unwraps it.
    with _lock:
        global_config.default_backend = (
            backend if wrapped is getattr(backend, "endpoint", None) else wrapped
        )


def get_default_backend() -> Backend | None:
    default = global_config.default_backend
    return None if default is None else as_backend(default)


def resolve_backend(backend: Any = None) -> Backend:
    """The backend a run uses: the one given, else the default; `NoBackendError` if neither."""
    if backend is not None:
        return as_backend(backend)
    default = global_config.default_backend
    if default is not None and not isinstance(default, Backend):
        return as_backend(default)
    if default is None:
        raise NoBackendError(
            "no backend: call radixlm.set_default_backend(radixlm.Engine()) "
            "(or radixlm.RuntimeEndpoint(url)) first, or pass backend=..."
        )
    return default
