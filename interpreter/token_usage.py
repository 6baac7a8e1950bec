"""`TokenUsage`: SGLang's per-backend token counter (`backend.token_usage`), for radixlm's native
backends (`RuntimeEndpoint`, the in-process Engine's backend).

Counts the prompt and completion tokens of every `gen` call the backend answers (from the
response's `meta_info`), `select` and cache-warming calls excluded, as SGLang's OpenAI backend
counts its completions. Threading: `run_batch` runs many programs on one backend at once, so
updates take a lock.
"""

from __future__ import annotations

import threading
from typing import Any


class TokenUsage:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def __repr__(self) -> str:
        return f"TokenUsage(prompt_tokens={self.prompt_tokens}, completion_tokens={self.completion_tokens})"

    def add(self, meta_info: dict[str, Any] | None) -> None:
        if not meta_info:
            return
        with self._lock:
            self.prompt_tokens += int(meta_info.get("prompt_tokens") or 0)
            self.completion_tokens += int(meta_info.get("completion_tokens") or 0)

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = 0
            self.completion_tokens = 0
