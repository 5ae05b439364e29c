"""What every engine shares: the `Engine` interface the tasks call, the device a worker runs on, and the padded
probe inputs engines are checked on against the torch model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from bucketing.engines import precision
    from bucketing.engines.shadow import Shadow
    from bucketing.model.head import Head

TOLERANCE = 1e-5  # max abs difference of pooled outputs between an engine and the torch model


class Engine(Protocol):
    name: str
    device: str

    @property
    def fidelity(self) -> precision.Fidelity | None:
        """A reduced dtype's fidelity to float32, measured at load; None in float32."""
        ...

    @property
    def shadow(self) -> Shadow | None:
        """A reduced dtype's shadow checks of served texts (`handler.fidelity_sample`); None when off."""
        ...

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray: ...

    @property
    def has_states(self) -> bool:
        """Whether `states` gives the encoder's token embeddings (an embedding model's engine; late chunking)."""
        ...

    def states(self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None) -> tuple[Any, Any]:
        """One pass's pooled outputs (as calling it) and the encoder's token embeddings [rows, length, hidden]."""
        ...


def select_device(gpu_id: Any, cuda_available: bool) -> str:
    """`cuda:<gpu_id>` when TorchServe gave the worker a GPU and CUDA is there, else `cpu`."""
    if gpu_id is None or gpu_id == "" or not cuda_available:
        return "cpu"
    return f"cuda:{int(gpu_id)}"


def probe(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded inputs to compare engines on: three rows of 24 tokens, two of them padded, and a pooling mask
    that leaves two leading (prompt) tokens of the last row out."""
    rng = np.random.default_rng(seed)
    low = min(1000, vocab_size // 2)
    ids = rng.integers(low, max(low + 1, min(2000, vocab_size)), size=(3, 24), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 17:] = 0
    pool_mask = mask.copy()
    pool_mask[2, :2] = 0
    return ids, mask, pool_mask


def probe_types(mask: np.ndarray) -> np.ndarray:
    """Token types to compare engines on: the second half of each row's real tokens of type 1 (a pair)."""
    types = np.zeros_like(mask)
    for row, n in enumerate(mask.sum(axis=1)):
        types[row, n // 2 : n] = 1
    return types


def head_inputs(
    head: Head, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    """What a head takes, in its order: ids and mask; for embeddings the pooling mask (the attention mask unless
    told); for a pair classifier the token types (zeros unless told)."""
    if head.pooled:
        return ids, mask, mask if pool_mask is None else pool_mask
    if head.types:
        return ids, mask, np.zeros_like(ids) if types is None else types
    return ids, mask


def graph_feed(
    names: list[str],
    ids: np.ndarray,
    mask: np.ndarray,
    pool_mask: np.ndarray | None = None,
    types: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """An exported graph's inputs by name (`names`: those it takes): ids and mask; the pooling mask (the attention
    mask unless told); token types (zeros unless told)."""
    feed = {
        "input_ids": ids,
        "attention_mask": mask,
        "pool_mask": mask if pool_mask is None else pool_mask,
        "token_type_ids": np.zeros_like(ids) if types is None else types,
    }
    return {name: feed[name] for name in names}


def probe_diff(engine: Any, reference: Any, vocab_size: int) -> float:
    """The largest difference between an engine's outputs and a reference engine's on the padded probe inputs."""
    ids, mask, pool_mask = probe(vocab_size)
    types = probe_types(mask)
    return float(np.abs(engine(ids, mask, pool_mask, types) - reference(ids, mask, pool_mask, types)).max())
