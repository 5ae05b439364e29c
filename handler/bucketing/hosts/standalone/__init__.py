"""The standalone host: the worker behind its own ASGI server (uvicorn), no TorchServe and no JRE.

`models` (what to serve: a model folder, an archive, a model-config), `batcher` (an asyncio batcher per model,
workers in their own threads), `app` (the ASGI app over the shared route table), `prometheus` (`/metrics`),
`server` (uvicorn with a draining SIGTERM), `__main__` (the command line). docs/hosts/standalone.md.
"""
