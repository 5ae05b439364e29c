"""Serving delivered batches, above the model kinds' tasks and the wire formats: the serving loop (`pipeline`: one
TorchServe call from request rows to replies) and continuous batching's pool of pending requests across calls
(`continuous`, `handler.schedule: continuous`)."""
