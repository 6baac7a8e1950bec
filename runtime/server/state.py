"""`ServerState`: what the routes share (one per server process, stored on `app.state.server`).

Threading: read and written only on uvicorn's event loop (the signal handler only schedules the
drain onto that loop). Ownership: `launch_server` creates it with the started child processes;
the app's lifespan creates the TokenizerManager (`tm`) on the running loop and closes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.errors import EngineDeadError
from radixlm.runtime.frontend.tokenizer_manager import TokenizerManager
from radixlm.runtime.models.default_model import DEFAULT_MODEL_NAME, default_model_path
from radixlm.runtime.processes.launch import EngineProcesses
from radixlm.runtime.server_args import ServerArgs

# Paths whose requests run the engine: counted as in flight, refused while draining.
WORK_PATHS = frozenset(
    {"/generate", "/v1/completions", "/v1/chat/completions", "/health_generate", "/flush_cache"}
)


@dataclass
class ServerState:
    args: ServerArgs
    procs: EngineProcesses | None  # None in unit tests that fake the engine
    tokenizer: Any
    tm: TokenizerManager | None = None
    metrics: Any = None  # ServerMetrics when enabled
    ready: bool = False  # set after the warm-up request: /health answers 200 from then on
    draining: bool = False  # set by SIGTERM/SIGINT: new work gets 503
    in_flight: int = 0  # requests on WORK_PATHS being served now
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The name clients use (`model` in the OpenAI API)."""
        if self.args.served_model_name:
            return self.args.served_model_name
        return DEFAULT_MODEL_NAME if self.args.model_path is None else self.args.model_path

    @property
    def model_path(self) -> str:
        if self.args.model_path is not None:
            return self.args.model_path
        try:
            return default_model_path()
        except FileNotFoundError:
            return DEFAULT_MODEL_NAME

    @property
    def context_length(self) -> int | None:
        return int(self.tm.info["context_length"]) if self.tm is not None else None

    @property
    def engine(self) -> TokenizerManager:
        """The TokenizerManager; raises EngineDeadError (503) once the scheduler is gone."""
        if self.tm is None:
            raise EngineDeadError("the engine is not started")
        if self.tm.dead:
            raise EngineDeadError(self.tm.dead)
        return self.tm

    def unhealthy_reason(self) -> str:
        """'' when /health should answer 200."""
        if self.tm is None or not self.ready:
            return "the server is starting"
        if self.tm.dead:
            return f"the engine is dead: {self.tm.dead}"
        if self.draining:
            return "the server is shutting down"
        return ""

    def public_args(self) -> dict[str, Any]:
        """ServerArgs without secrets (the API key is never echoed)."""
        out = dict(vars(self.args))
        if out.get("api_key"):
            out["api_key"] = "<redacted>"
        return out

    def pids(self) -> dict[str, int]:
        pids = {"server_pid": os.getpid()}
        if self.procs is not None:
            pids.update({f"{role}_pid": proc.pid for role, proc in self.procs.procs.items()})
        return pids
