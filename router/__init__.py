"""The data-parallel router: `radixlm router --worker-urls URL...` and `radixlm serve --dp-size N`.

One concept per module: `approx_tree` (a worker's approximate prefix cache), `policy` (which worker
gets a request), `worker` (the pool and its health checks), `proxy` (relaying requests and
streams), `metrics`, `config` (the flags), `app` (the HTTP app), `launch` (the command) and `dp`
(replicas behind the router). Imports no torch: the router holds no model.
"""
