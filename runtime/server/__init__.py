"""radixlm's HTTP server: SGLang's native API and the OpenAI-compatible API on FastAPI + uvicorn.

Layout: `protocol.py` / `openai_protocol.py` (request models), `app.py` (the app factory),
`native_api.py` and `openai_api.py` (routes), `openai_serving.py` / `openai_format.py` (OpenAI
requests -> engine requests -> OpenAI responses), `middleware.py` (API key, body limit, drain
gate), `metrics.py` and `request_log.py` (observability), `launch_server.py` (`radixlm serve`).
One process: uvicorn's event loop hosts the TokenizerManager; the scheduler and detokenizer are
child processes started by `runtime/processes/launch.py`, exactly as for the embedded `Engine`.
"""
