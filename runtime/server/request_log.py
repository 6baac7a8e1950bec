"""One structured log line per ended request (info level, logger `radixlm.request`):

    request {"rid": "...", "outcome": "finished", "finish_reason": "length", "prompt_tokens": 12,
             "completion_tokens": 16, "cached_tokens": 8, "stream": true, "e2e_s": 0.93,
             "ttft_s": 0.21, "error": null}

Prompts and outputs are never logged (they may be private). Disabled with `--no-log-requests`.
Threading: a TokenizerManager listener, called on uvicorn's event loop.
"""

from __future__ import annotations

import json
import logging
import time

from radixlm.runtime.frontend.tokenizer_manager import ReqState
from radixlm.runtime.server.metrics import HEALTH_RID_PREFIX

logger = logging.getLogger("radixlm.request")


def log_request_end(state: ReqState) -> None:
    if state.rid.startswith(HEALTH_RID_PREFIX) or not logger.isEnabledFor(logging.INFO):
        return
    out = state.out
    reason = (out.finish_reason or {}).get("type") if out is not None else None
    record = {
        "rid": state.rid,
        "outcome": state.outcome,
        "finish_reason": reason,
        "prompt_tokens": len(state.prompt_ids),
        "completion_tokens": len(state.output_ids),
        "cached_tokens": out.cached_tokens if out is not None else 0,
        "stream": state.stream,
        "e2e_s": round(time.perf_counter() - state.created, 4),
        "ttft_s": (
            round(state.first_token_time - state.created, 4)
            if state.stream and state.first_token_time is not None
            else None
        ),
        "error": str(state.error) if state.error is not None else None,
    }
    logger.info("request %s", json.dumps(record))
