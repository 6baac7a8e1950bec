"""The public API of the language, as `radixlm` re-exports it (`import radixlm as rl`).

This module lives in `interpreter` (not `lang`) because it joins both layers and dependencies
point lang <- interpreter. It imports neither torch nor the runtime: `Engine` and the HTTP/OpenAI
backends are resolved lazily by `lazy_attribute`, which the package's `__getattr__` calls.
"""

from __future__ import annotations

import importlib
from typing import Any

from radixlm.interpreter.backend import Backend
from radixlm.interpreter.cancel import ProgramInterruptedError
from radixlm.interpreter.config import (
    get_default_backend,
    global_config,
    resolve_backend,
    set_default_backend,
)
from radixlm.interpreter.state import ProgramState, ProgramStateGroup
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.errors import (
    LangError,
    NoBackendError,
    ProgramError,
    UnsupportedFeatureError,
    VariableNotFoundError,
)
from radixlm.lang.function import Function, function
from radixlm.lang.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixlm.lang.sampling import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR


def flush_cache(backend: Any = None) -> bool:
    """Empty the prefix cache of `backend` (default: the default backend). Returns True, or
    False with a warning while requests run (the runtime refuses then)."""
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return resolve_backend(backend).get_server_info()


# name -> (module, attribute), imported on first access.
# NOTE: the HTTP backends are lazy too: `import radixlm` must not import httpx or openai.
_LAZY = {
    "Engine": ("radixlm.runtime.frontend.engine", "Engine"),
    "EngineBackend": ("radixlm.interpreter.engine_backend", "EngineBackend"),
    "RuntimeEndpoint": ("radixlm.interpreter.runtime_endpoint", "RuntimeEndpoint"),
    "EndpointError": ("radixlm.interpreter.runtime_endpoint", "EndpointError"),
    "EndpointRequestError": ("radixlm.interpreter.runtime_endpoint", "EndpointRequestError"),
    "EndpointAuthError": ("radixlm.interpreter.runtime_endpoint", "EndpointAuthError"),
    "EndpointConnectionError": ("radixlm.interpreter.runtime_endpoint", "EndpointConnectionError"),
    "OpenAI": ("radixlm.interpreter.openai_backend", "OpenAI"),
}


def lazy_attribute(name: str) -> Any:
    """Resolve one of the lazily imported public names; AttributeError for anything else."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'radixlm' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attr)


__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "Backend",
    "ChatTemplate",
    "Function",
    "LangError",
    "NoBackendError",
    "ProgramError",
    "ProgramInterruptedError",
    "ProgramState",
    "ProgramStateGroup",
    "UnsupportedFeatureError",
    "VariableNotFoundError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
LAZY_NAMES = tuple(_LAZY)
