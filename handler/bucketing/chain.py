"""A sentence-transformers folder's module chain, read from its files: what the model computes after the encoder.

Pure (JSON only, no torch). `modules.json` lists the modules in order; each type is named either
`sentence_transformers.models.X` or by its module path in sentence-transformers 5/6
(`sentence_transformers.base.modules.transformer.Transformer`, `...sentence_transformer.modules.pooling.Pooling`);
only the class name counts. Served: one `Transformer` (first), then `Pooling` (every mode sentence-transformers
has, several concatenated in its order, `include_prompt`), any number of `Dense` (bias or not, any activation of
`torch.nn`), and a final `Normalize`. A folder without `modules.json` is a plain Hugging Face model: mean pooling,
normalised as `handler.normalize` says (what this handler always did). Anything else stops the build and the
worker with one line naming the module and its folder: nothing is approximated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers' legacy Pooling keys, in the order it concatenates them.
LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
SERVED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
ACTIVATION_PREFIX = "torch.nn.modules."  # Dense activations: classes of torch.nn, built with no arguments
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class ChainError(ValueError):
    """A module chain this handler cannot serve exactly; the message names the module and its folder."""


@dataclass(frozen=True)
class DenseLayer:
    """One `Dense` module: a linear layer from `in_features` to `out_features`, then its activation."""

    path: str  # the module's folder, relative to the model folder
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn class path, e.g. torch.nn.modules.activation.Tanh


@dataclass(frozen=True)
class Chain:
    """What the model computes after its encoder, and the sentence-transformers settings around it."""

    source: str = "huggingface"  # or "sentence-transformers" (a modules.json was read)
    pooling: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool | None = None  # ends in Normalize (sentence-transformers); None: not said (plain folder)
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    do_lower_case: bool = False

    def dimensions(self, hidden_size: int) -> int:
        """The embedding's size: the last Dense's output, else one hidden vector per pooling mode."""
        return self.dense[-1].out_features if self.dense else hidden_size * len(self.pooling)

    def describe(self) -> dict[str, Any]:
        """What was read, as plain data (the archive's model-config and the worker's ready line record it)."""
        return {
            "source": self.source,
            "pooling": list(self.pooling),
            "include_prompt": self.include_prompt,
            "dense": [f"{d.in_features}->{d.out_features} {d.activation.rsplit('.', 1)[-1]}" for d in self.dense],
            "normalize": self.normalize,
            "prompts": dict(self.prompts),
            "default_prompt_name": self.default_prompt_name,
            "max_seq_length": self.max_seq_length,
            "do_lower_case": self.do_lower_case,
        }


def read_chain(model_dir: Path | str) -> Chain:
    """The folder's module chain (a plain Hugging Face folder: the default Chain); ChainError if not servable."""
    folder = Path(model_dir)
    modules_file = folder / "modules.json"
    prompts, default_prompt = _prompts(folder)
    if not modules_file.is_file():
        return Chain(prompts=prompts, default_prompt_name=default_prompt)
    modules = _json(modules_file)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, Mapping) for m in modules):
        raise ChainError(f"{modules_file}: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    for kind, module in zip(kinds, modules):
        if kind not in SERVED_MODULES:
            where = folder / str(module.get("path", ""))
            raise ChainError(
                f"module {module.get('type')!r} in {where} is not served (served: "
                f"{', '.join(SERVED_MODULES)}); this model cannot be served exactly"
            )
    if kinds[0] != "Transformer" or kinds.count("Transformer") != 1:
        raise ChainError(f"{modules_file}: the chain must start with its one Transformer, got {', '.join(kinds)}")
    if kinds.count("Pooling") != 1 or kinds[1] != "Pooling":
        raise ChainError(f"{modules_file}: a Pooling module must follow the Transformer, got {', '.join(kinds)}")
    if "Normalize" in kinds and kinds.index("Normalize") != len(kinds) - 1:
        raise ChainError(f"{modules_file}: Normalize must be the last module, got {', '.join(kinds)}")
    max_seq_length, lower = _transformer(folder / str(modules[0].get("path", "")))
    pooling, include_prompt = _pooling(folder / str(modules[1]["path"]))
    dense = tuple(_dense(folder, str(m["path"])) for k, m in zip(kinds, modules) if k == "Dense")
    return Chain(
        "sentence-transformers",
        pooling,
        include_prompt,
        dense,
        kinds[-1] == "Normalize",
        prompts,
        default_prompt,
        max_seq_length,
        lower,
    )


def module_folders(model_dir: Path | str) -> list[str]:
    """The module folders (relative) a chain reads, for the archive to carry: `1_Pooling`, `2_Dense`, ..."""
    modules_file = Path(model_dir) / "modules.json"
    if not modules_file.is_file():
        return []
    return [str(m["path"]) for m in _json(modules_file) if str(m.get("path", "")) not in ("", ".")]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChainError(f"{path}: not readable JSON ({type(e).__name__}: {str(e)[:120]})") from None


def read_prompts(model_dir: Path | str) -> Chain:
    """A classifier's settings: no module chain, the prompts a CrossEncoder saves (config_sentence_transformers.json),
    which it puts before each pair's first text."""
    prompts, default_prompt = _prompts(Path(model_dir))
    return Chain(prompts=prompts, default_prompt_name=default_prompt)


def _prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    path = folder / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None
    cfg = _json(path)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, Mapping) or not all(isinstance(v, str) for v in prompts.values()):
        raise ChainError(f"{path}: prompts must map names to texts")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ChainError(f"{path}: default_prompt_name {default!r} is not among its prompts ({', '.join(prompts)})")
    return {str(k): v for k, v in prompts.items()}, default


def _transformer(path: Path) -> tuple[int | None, bool]:
    """`sentence_bert_config.json`'s max_seq_length and do_lower_case (absent in newer folders: the tokenizer's)."""
    for name in ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json"):
        if (path / name).is_file():
            cfg = _json(path / name)
            length = cfg.get("max_seq_length")
            return (int(length) if length else None), bool(cfg.get("do_lower_case", False))
    return None, False


def _pooling(path: Path) -> tuple[tuple[str, ...], bool]:
    cfg = _json(path / "config.json")
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in LEGACY_POOLING.items() if cfg.get(key)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ChainError(
            f"module Pooling in {path}: pooling mode {unknown[0]!r} is not served (served: {', '.join(POOLING_MODES)})"
        )
    return modes, bool(cfg.get("include_prompt", True))


def _dense(folder: Path, relative: str) -> DenseLayer:
    path = folder / relative
    cfg = _json(path / "config.json")
    activation = str(cfg.get("activation_function") or "torch.nn.modules.linear.Identity")
    if not activation.startswith(ACTIVATION_PREFIX):
        raise ChainError(f"module Dense in {path}: activation {activation!r} is not a torch.nn class; not served")
    if not any((path / w).is_file() for w in DENSE_WEIGHTS):
        raise ChainError(f"module Dense in {path}: no weights ({' or '.join(DENSE_WEIGHTS)})")
    return DenseLayer(
        relative, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), activation
    )
