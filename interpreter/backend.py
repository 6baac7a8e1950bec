"""The Backend seam: what the interpreter needs from something that runs a model.

Implementations: `EngineBackend` (the in-process `radixlm.Engine`), `RuntimeEndpoint` (SGLang's
native HTTP protocol), and an OpenAI-compatible chat backend. The first two share all their logic
in `NativeBackend` (they differ only in how one native `/generate` request travels), so a new
native transport is one small class.

Ownership and threading rules:
- A backend is shared by every program state that runs on it, from many threads at once (one
  executor thread per state, plus `run_batch`'s pool). Every method must be thread-safe and must
  not keep per-program state: all the program's context is in the arguments.
- The backend owns its connection / engine handle. `shutdown()` releases what the backend itself
  created; an engine or server passed in by the user is the user's to shut down.
- Methods take the full text of the state (the runtime's prefix cache makes re-sending it cheap)
  and return plain values; they never see or mutate a `ProgramState`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.errors import UnsupportedFeatureError
from radixlm.lang.sampling import SamplingParams

# meta_info as SGLang returns it: prompt_tokens, completion_tokens, cached_tokens, finish_reason,
# and the logprob lists when requested.
MetaInfo = dict[str, Any]


class Backend(ABC):
    """Runs the model for the interpreter. See the module docstring for the rules."""

    @property
    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """The per-role strings used to render `system/user/assistant` for this model."""

    @abstractmethod
    def generate(self, text: str, params: SamplingParams) -> tuple[str, MetaInfo]:
        """Continue `text`; return the completion (stop strings trimmed) and its meta info."""

    def generate_stream(self, text: str, params: SamplingParams) -> Iterator[tuple[str, MetaInfo]]:
        """Yield `(delta, meta_info)` pairs as the completion grows; the deltas concatenate to it.

        The default runs `generate` and yields its result once.
        """
        yield self.generate(text, params)

    @abstractmethod
    def select(
        self,
        text: str,
        choices: Sequence[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        """Score each `text + choice` (one batched call) and let `choices_method` decide."""

    def cache_prefix(self, text: str) -> None:  # noqa: B027 (optional hook)
        """Make `text` resident in the runtime's prefix cache (no-op where there is none)."""

    def flush_cache(self) -> bool:
        """Drop the runtime's prefix cache: True, or False with a warning while requests run."""
        raise UnsupportedFeatureError(f"{type(self).__name__} cannot flush a cache")

    def abort_request(self, rid: str) -> None:  # noqa: B027 (optional hook)
        """Abort the request tagged `rid` (Ctrl-C in a program; no-op where it cannot)."""

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:  # noqa: B027 (optional hook)
        """Release what this backend created (not an engine or server the user passed in)."""

    # SGLang's method name for the chat template.
    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template
