"""Hosts that own their HTTP and run the same worker as TorchServe's handler (the top floor of `bucketing`: nothing
below imports it, and no archive carries it).

- `routes`: the one route table every such host shares (path patterns to the worker's `url_path`, or to the host's
  own answers: health, readiness, metrics), and TorchServe's own error bodies where a host must answer as it does;
- `rows`: an HTTP request turned into the row and `Meta` TorchServe's worker would hand the handler, so the worker
  answers byte for byte what it answers behind TorchServe;
- `standalone/`: an ASGI server (uvicorn) with an asyncio batcher per model: `python -m bucketing.hosts.standalone`.
"""
