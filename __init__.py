"""radixlm: an embeddable structured-generation language and the fast LLM runtime that executes it."""

from __future__ import annotations

__version__ = "0.1.0"
