"""radixlm: an embeddable structured-generation language and the fast LLM runtime that executes it.

    import radixlm as rl
    rl.set_default_backend(rl.Engine())          # default model: SmolLM2-135M-Instruct

Importing radixlm is light: the language is pure Python, and the runtime (torch, the Engine, the
HTTP/OpenAI backends) is imported on first use of those names.
"""

from __future__ import annotations

from typing import Any

from radixlm._version import __version__
from radixlm.interpreter.api import *  # noqa: F403
from radixlm.interpreter.api import LAZY_NAMES, lazy_attribute
from radixlm.interpreter.api import __all__ as _lang_all

__all__ = [*_lang_all, *LAZY_NAMES, "__version__"]


def __getattr__(name: str) -> Any:
    value = lazy_attribute(name)
    globals()[name] = value
    return value
