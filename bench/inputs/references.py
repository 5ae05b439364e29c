"""Our float32 references: the handler's answer to each text served alone (torch engine, batch of one), in this
process, which every configuration's answers and every peer's are checked against (`cosine`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from model_store.archives import SERVED


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb) if na and nb else 0.0


def reference_embeddings(
    texts: Sequence[str], model_dir: Path, max_length: int = SERVED.max_length
) -> list[list[float]]:
    """Our handler's answer to each text served alone (torch engine, batch of one), in this process."""
    from bucketing import worker
    from bucketing.config import HandlerConfig
    from bucketing.kinds.task import Rows
    from bucketing.model.encoded import collate

    config = HandlerConfig(engine="torch", torchscript=False, max_length=max_length)
    model = worker.load(config, str(model_dir))  # the handler's task and tokenizer, as a worker opens them
    task, tokenizer = model.task, model.tokenizer
    out = []
    for encoded in tokenizer.encode(list(texts)):
        ids, mask = collate([encoded.ids], len(encoded.ids), 0)
        out.append([float(x) for x in task.forward(Rows(ids, mask))[0]])
    return out
