"""A transformer folder's config.json checked against its weights' headers before anything is allocated.

`from_pretrained` first allocates every tensor at the sizes config.json declares (`vocab_size`, `hidden_size`, ...),
then finds that the weights do not fit them: a config.json that says a vocabulary of 15 million ids costs gigabytes
before transformers' multi-line size-mismatch report. Here the model config.json describes is built on torch's meta
device (no memory), and each of its tensors is compared with the same tensor in the weights' headers (safetensors
headers; `pytorch_model.bin` memory-mapped, weights only; sharded checkpoints through their index): the first
difference is one line naming the config.json size and the tensor. Checked at build and at worker start, for every
kind, with the transformers class the worker loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bucketing.model.chain import ChainError, pytorch_bin_shapes, safetensors_shapes

# The weights from_pretrained reads, in the order it prefers them: (file, its index when sharded, its reader).
CHECKPOINTS: tuple[tuple[str, str, Callable[[Path], dict[str, list[int]]]], ...] = (
    ("model.safetensors", "model.safetensors.index.json", safetensors_shapes),
    ("pytorch_model.bin", "pytorch_model.bin.index.json", pytorch_bin_shapes),
)


def saved_shapes(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """Each saved tensor's file and shape, from the weights from_pretrained would read (none found: empty)."""
    for file, index, read in CHECKPOINTS:
        if (folder / file).is_file():
            return {name: (file, shape) for name, shape in read(folder / file).items()}
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise ChainError(f"{folder / index}: not a checkpoint index (no weight_map); refused") from None
            return {name: (shard, shape) for shard in shards for name, shape in read(folder / shard).items()}
    return {}


def declared_shapes(auto: Any, folder: Path) -> tuple[dict[str, list[int]], str]:
    """The tensors of the model `auto` builds from the folder's config.json, built on the meta device (no memory),
    and its base model's prefix (how a head's checkpoint names the base model's tensors)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):  # an Auto class's from_config, or a model class's own (T5EncoderModel)
        model = auto.from_config(config) if hasattr(auto, "from_config") else auto._from_config(config)  # noqa: SLF001
    return {k: list(v.shape) for k, v in model.state_dict().items()}, str(model.base_model_prefix or "")


def check_weight_shapes(auto: Any, folder: str | Path) -> None:
    """ChainError in one line when a tensor saved in the folder's weights is not the shape config.json makes it
    for `auto` (a transformers Auto class): what from_pretrained would refuse after allocating it."""
    folder = Path(folder)
    saved = saved_shapes(folder)
    if not saved:
        return  # no weights from_pretrained reads: it says so itself
    try:
        declared, prefix = declared_shapes(auto, folder)
    except Exception:  # noqa: BLE001 - a config transformers cannot build: from_pretrained reports it itself
        return
    for name, (file, shape) in sorted(saved.items()):
        own = counterpart(name, declared, prefix)
        if own is not None and declared[own] != shape:
            raise ChainError(f"{folder}: {mismatch(folder, declared[own], name, file, shape)}; refused")


def counterpart(name: str, declared: Mapping[str, list[int]], prefix: str) -> str | None:
    """The model's tensor a saved tensor loads into: the same name, or with the base model's prefix added (a base
    model's checkpoint under a head) or taken off (a head's checkpoint as the base model); None: not loaded."""
    for candidate in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")):
        if candidate in declared:
            return candidate
    return None


def mismatch(folder: Path, want: list[int], name: str, file: str, shape: list[int]) -> str:
    """`config.json says vocab_size 15000000 but model.safetensors' embeddings.word_embeddings.weight is [1000,
    32]`: the config.json sizes behind the dimensions that differ, else the shape it makes."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    sizes = config.items() if isinstance(config, dict) else ()
    differ = [w for i, w in enumerate(want) if i >= len(shape) or shape[i] != w]
    said = [f"{k} {v}" for k, v in sizes if type(v) is int and v in differ] if len(want) == len(shape) else []
    claim = " and ".join(said) if said else f"{name} is {want}"
    owner = f"{file}'" if file.endswith("s") else f"{file}'s"
    return f"config.json says {claim} but {owner} {name} is {shape}"
