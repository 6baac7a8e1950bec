"""radixlm: an embeddable structured-generation language and the fast LLM runtime that executes it.

    import radixlm as rl
    rl.set_default_backend(rl.Engine())          # default model: SmolLM2-135M-Instruct

Importing radixlm is light: the language is pure Python, and the runtime (torch, the Engine, the
HTTP/OpenAI backends) is imported on first use of those names.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from radixlm._version import __version__
from radixlm.interpreter.api import *  # noqa: F403
from radixlm.interpreter.api import LAZY_NAMES, lazy_attribute
from radixlm.interpreter.api import __all__ as _lang_all

__all__ = [*_lang_all, *LAZY_NAMES, "__version__"]


def _unshadow_checkout() -> None:
    """Move this package's own folder to the end of `sys.path`.

    NOTE: the package's folder is a checkout's root. Python run from there (`python -m pytest`,
    `python -m radixlm ...`, and the child processes that inherit that working directory) puts it
    first on `sys.path`, and its subpackages then shadow installed top-level modules of the same
    names: transformers >= 5.25 imports the `kernels` distribution from PyPI and got this
    package's `kernels/`. Last, it still serves what only it has (the tests' `tests.*` modules,
    which spawned test processes import by name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [p for p in sys.path if os.path.abspath(p or os.curdir) == here]
    if entries:
        sys.path[:] = [p for p in sys.path if p not in entries] + [here]


_unshadow_checkout()


def __getattr__(name: str) -> Any:
    value = lazy_attribute(name)
    globals()[name] = value
    return value
