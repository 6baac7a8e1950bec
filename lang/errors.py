"""Typed errors of the language and its interpreter.

Ownership: this module only defines exception types; nothing here holds state. Every error the
language raises on purpose derives from `LangError`, so callers can catch the family at once.
"""

from __future__ import annotations


class LangError(Exception):
    """Base class of every error raised on purpose by `radixlm.lang` / `radixlm.interpreter`."""


class UnsupportedFeatureError(LangError, NotImplementedError):
    """A primitive or option exists in SGLang's language but radixlm (or a backend) cannot run it.

    Derives from `NotImplementedError` too, so code written against SGLang that catches that
    still works.
    """


class NoBackendError(LangError, RuntimeError):
    """A program was run without a backend and no default backend is set."""


class ProgramError(LangError, RuntimeError):
    """A program failed while it ran.

    Raised when a program's result is read after one of its expressions failed in the executor
    (e.g. the backend rejected a `gen`). `__cause__` is the original exception; the message names
    the program and the line of the user's function that submitted the failing expression.
    """


class ChatTemplateError(LangError, ValueError):
    """A chat template could not be rendered or split into per-role prefixes and suffixes."""


class VariableNotFoundError(LangError, KeyError):
    """A program state has no variable of that name (`s["x"]`, `text_iter("x")`,
    `get_meta_info("x")`). Derives from `KeyError`, which such reads raised before."""

    def __str__(self) -> str:  # NOTE: KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""
