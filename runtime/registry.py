"""`Registry`: name -> implementation of a seam, imported on first use.

One per seam, in a small module beside it: `attention/registry.py` (attention backends),
`mem/registry.py` (prefix caches), `constrained/registry.py` (grammar backends),
`models/registry.py` (model architectures). `ServerArgs` checks the names a user gives against
them (in the user's process, before any child starts); the child that builds the component
calls `load(name)`. Entries are "module:attribute" strings, so listing or checking names imports
nothing (no torch in the user's process).
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from radixlm.runtime.errors import InvalidRequestError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "attention backend": for messages
        self._targets: dict[str, str] = {}

    def register(self, name: str, target: str) -> None:
        """`target` is "package.module:attribute" (a class or a factory)."""
        if name in self._targets:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._targets[name] = target

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def check(self, name: str, field: str) -> str:
        """`name`, or InvalidRequestError naming `field` and listing the registered names."""
        if name not in self._targets:
            raise InvalidRequestError(f"{field} must be one of {self.names()}, got {name!r}", field)
        return name

    def load(self, name: str) -> T:
        """The registered class or factory (imports its module); KeyError for an unknown name
        (callers check names first: `check`, or their own error)."""
        module, _, attribute = self._targets[name].partition(":")
        return getattr(importlib.import_module(module), attribute)
