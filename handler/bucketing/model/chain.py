"""A sentence-transformers folder's module chain, read from its files: what the model computes after the encoder.

Pure (JSON only; torch only to read the shapes in a Dense module's `pytorch_model.bin`). `modules.json` lists
the modules in order; each type is named either `sentence_transformers.models.X` or by its module path in
sentence-transformers 5/6
(`sentence_transformers.base.modules.transformer.Transformer`, `...sentence_transformer.modules.pooling.Pooling`);
only the class name counts. Served: one `Transformer` (first), then `Pooling` (every mode sentence-transformers
has, several concatenated in its order, `include_prompt`), any number of `Dense` (bias or not, any activation of
`torch.nn`), and a final `Normalize`. A folder without `modules.json` is a plain Hugging Face model: mean pooling,
normalised as `handler.normalize` says (what this handler always did). Anything else stops the build and the
worker with one line naming the module and its folder: nothing is approximated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
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
SAFETENSORS_HEADER_CAP = 100 << 20  # bytes: safetensors' own limit on a header
# Bytes per element of each safetensors dtype (its format's names).
SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2}
SAFETENSORS_DTYPE_BYTES |= {"BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class ChainError(ValueError):
    """A module chain this handler cannot serve exactly; the message names the module and its folder."""


INPUT_TYPES = ("query", "document")  # a request's `input_type`: sentence-transformers' encode_query / encode_document


@dataclass(frozen=True)
class DenseLayer:
    """One `Dense` module: a linear layer from `in_features` to `out_features`, then its activation."""

    path: str  # the module's folder, relative to the model folder
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn class path, e.g. torch.nn.modules.activation.Tanh

    def shapes(self) -> dict[str, list[int]]:
        """The tensors its weights must hold (names without sentence-transformers' `linear.` prefix)."""
        return {"weight": [self.out_features, self.in_features], **({"bias": [self.out_features]} if self.bias else {})}


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
    prompts, default_prompt = prompt_settings(folder)
    if not modules_file.is_file():
        return Chain(prompts=prompts, default_prompt_name=default_prompt)
    modules = json_file(modules_file)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, Mapping) for m in modules):
        raise ChainError(f"{modules_file}: expected a list of modules")
    return chain_of(folder, modules, prompts, default_prompt)


def chain_of(
    folder: Path, modules: Sequence[Mapping[str, Any]], prompts: Mapping[str, str], default_prompt: str | None
) -> Chain:
    """The dense chain these modules (of the folder's modules.json) compute; ChainError if not servable."""
    modules_file = folder / "modules.json"
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    for kind, module in zip(kinds, modules):
        if kind == "Router":
            raise ChainError(router_refusal(folder, module))
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
    pooling, include_prompt = _pooling(module_path(folder, modules[1]))
    return module_chain(folder, modules, (pooling, include_prompt), (prompts, default_prompt))


def router_refusal(folder: Path, module: Mapping[str, Any]) -> str:
    """The line refusing a dense model's Router (its routes run modules of their own, a transformer each: queries and
    documents through different models), naming the module, its folder and its routes."""
    where = module_path(folder, module)
    try:
        structure = json_mapping(where / "router_config.json").get("structure")
    except ChainError:
        structure = None
    routes = (
        "; ".join(f"{name}: {', '.join(map(str, mods))}" for name, mods in structure.items() if isinstance(mods, list))
        if isinstance(structure, Mapping)
        else "unread"
    )
    return (
        f"module {module.get('type')!r} in {where} (routes {routes}) is not served in a dense model: it routes "
        "texts through modules of their own, which this handler does not run (served: Transformer, Pooling, Dense, "
        "Normalize; a Router only in a SparseEncoder folder); serve each route as a model of its own "
        "(SentenceTransformer(modules=<its modules>).save(dir), an archive each)"
    )


def module_chain(
    folder: Path,
    modules: Sequence[Mapping[str, Any]],
    pooling: tuple[tuple[str, ...], bool],
    prompts: tuple[Mapping[str, str], str | None],
    kinds: Sequence[str] | None = None,
) -> Chain:
    """The chain of checked modules (a Transformer first): its settings, `pooling` (modes, include_prompt), its
    Dense layers, whether it ends in Normalize, and `prompts` (the prompts, the default prompt's name)."""
    kinds = kinds or [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    max_seq_length, lower = transformer_settings(module_path(folder, modules[0]))
    dense = tuple(dense_layer(folder, m) for k, m in zip(kinds, modules) if k == "Dense")
    return Chain("sentence-transformers", *pooling, dense, kinds[-1] == "Normalize", *prompts, max_seq_length, lower)


def module_folders(model_dir: Path | str) -> list[str]:
    """The module folders (relative) a chain reads, for the archive to carry: `1_Pooling`, `2_Dense`, ..."""
    folder = Path(model_dir)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return []
    modules = json_file(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, Mapping) for m in modules):
        raise ChainError(f"{modules_file}: expected a list of modules")
    return [str(m["path"]) for m in modules if module_path(folder, m) != folder]


def transformer_folder(model_dir: Path | str) -> Path:
    """Where a dense chain's Transformer keeps its model and tokenizer: the model folder itself (modules.json path
    "", as sentence-transformers saves it now), or the module folder modules.json names (`0_Transformer/`, the
    layout of older saves); the model folder too when it has no modules.json or the chain does not start with a
    Transformer (`read_chain` says why that is not served)."""
    folder = Path(model_dir)
    if not (folder / "modules.json").is_file():
        return folder
    modules = json_file(folder / "modules.json")
    first = modules[0] if isinstance(modules, list) and modules else None
    if not isinstance(first, Mapping) or str(first.get("type", "")).rsplit(".", 1)[-1] != "Transformer":
        return folder
    return module_path(folder, first)


def module_path(folder: Path, module: Mapping[str, Any]) -> Path:
    """A module's folder as modules.json names it, which must lie inside the model folder: a relative path without
    `..` (ChainError naming the path; what links resolve to is the archive builder's check)."""
    relative = module.get("path", "")
    if not isinstance(relative, str):
        raise ChainError(f"{folder / 'modules.json'}: module path {relative!r} is not a folder name")
    if PurePath(relative).is_absolute() or ".." in PurePath(relative.replace("\\", "/")).parts:
        raise ChainError(f"{folder / 'modules.json'}: module path {relative!r} leaves the model folder; refused")
    return folder / relative if relative not in ("", ".") else folder


def sentence_transformers_limit(max_seq_length: int | None, tokenizer_limit: int | None, positions: int) -> int:
    """The tokens per text sentence-transformers cuts at, within the model's positions: the folder's
    max_seq_length when it says one (it wins over the tokenizer's), else the tokenizer's model_max_length."""
    return min(max_seq_length or tokenizer_limit or positions, positions)


def json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChainError(f"{path}: not readable JSON ({type(e).__name__}: {str(e)[:120]})") from None


def read_prompts(model_dir: Path | str) -> Chain:
    """A classifier's settings: no module chain, the prompts a CrossEncoder saves (config_sentence_transformers.json),
    which it puts before each pair's first text."""
    prompts, default_prompt = prompt_settings(Path(model_dir))
    return Chain(prompts=prompts, default_prompt_name=default_prompt)


def prompt_settings(folder: Path) -> tuple[dict[str, str], str | None]:
    path = folder / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None
    cfg = json_mapping(path)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, Mapping) or not all(isinstance(v, str) for v in prompts.values()):
        raise ChainError(f"{path}: prompts must map names to texts")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ChainError(f"{path}: default_prompt_name {default!r} is not among its prompts ({', '.join(prompts)})")
    return {str(k): v for k, v in prompts.items()}, default


def transformer_settings(path: Path) -> tuple[int | None, bool]:
    """`sentence_bert_config.json`'s max_seq_length (a `model_max_length` of its tokenizer arguments wins, as in
    sentence-transformers; absent in newer folders: the tokenizer's) and do_lower_case."""
    for name in ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json"):
        if (path / name).is_file():
            cfg = json_mapping(path / name)
            kwargs = cfg.get("processor_kwargs") or cfg.get("tokenizer_args") or {}
            if isinstance(kwargs, Mapping) and kwargs.get("model_max_length") is not None:
                length = positive_int(kwargs["model_max_length"], f"{path / name}: tokenizer model_max_length")
            else:
                length = positive_int(cfg.get("max_seq_length"), f"{path / name}: max_seq_length")
            return length, bool(cfg.get("do_lower_case", False))
    return None, False


def positive_int(value: Any, what: str) -> int | None:
    """A positive integer setting (None when not set); ChainError in one line otherwise."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ChainError(f"{what} must be a positive integer, got {value!r:.40}")


def json_mapping(path: Path) -> Mapping[str, Any]:
    cfg = json_file(path)
    if not isinstance(cfg, Mapping):
        raise ChainError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _pooling(path: Path) -> tuple[tuple[str, ...], bool]:
    cfg = json_mapping(path / "config.json")
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in LEGACY_POOLING.items() if cfg.get(key)) or ("mean",)
    elif isinstance(mode, str) or (isinstance(mode, list) and mode and all(isinstance(m, str) for m in mode)):
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        raise ChainError(f"module Pooling in {path}: pooling_mode {mode!r:.40} is not a mode name or a list of them")
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ChainError(
            f"module Pooling in {path}: pooling mode {unknown[0]!r} is not served (served: {', '.join(POOLING_MODES)})"
        )
    return modes, bool(cfg.get("include_prompt", True))


def dense_layer(folder: Path, module: Mapping[str, Any]) -> DenseLayer:
    path = module_path(folder, module)
    cfg = json_mapping(path / "config.json")
    activation = str(cfg.get("activation_function") or "torch.nn.modules.linear.Identity")
    if not activation.startswith(ACTIVATION_PREFIX):
        raise ChainError(f"module Dense in {path}: activation {activation!r} is not a torch.nn class; not served")
    weights = [path / w for w in DENSE_WEIGHTS if (path / w).is_file()]
    if not weights:
        raise ChainError(f"module Dense in {path}: no weights ({' or '.join(DENSE_WEIGHTS)})")
    sizes = [
        positive_int(cfg.get(key), f"module Dense in {path}: config.json {key}")
        for key in ("in_features", "out_features")
    ]
    if sizes[0] is None or sizes[1] is None:
        raise ChainError(f"module Dense in {path}: config.json must give in_features and out_features")
    layer = DenseLayer(str(module["path"]), sizes[0], sizes[1], bool(cfg.get("bias", True)), activation)
    # checked before anything of the declared size is allocated, at build and at worker start alike
    read = safetensors_shapes if weights[0].name == "model.safetensors" else pytorch_bin_shapes
    check_dense_weights(path, layer, weights[0].name, read(weights[0]))
    return layer


def check_dense_weights(path: Path, layer: DenseLayer, file: str, shapes: Mapping[str, list[int]]) -> None:
    """ChainError in one line when the weights file's tensors (sentence-transformers' `linear.` prefix or not)
    are not the shapes the Dense module's config.json declares."""
    held = {k.removeprefix("linear."): list(v) for k, v in sorted(shapes.items())}  # in name order, whatever the file's
    if held != layer.shapes():
        raise ChainError(
            f"module Dense in {path}: config.json declares {layer.shapes()}, its {file} holds {held}; refused"
        )


def pytorch_bin_shapes(path: Path) -> dict[str, list[int]]:
    """The tensors' shapes in a `torch.save` file, read with `weights_only` (tensors and plain containers only,
    never an arbitrary object) and, for the zip format, memory-mapped (no tensor's data read). torch is imported
    here only: a folder whose Dense weights are safetensors reads as JSON alone."""
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # noqa: BLE001 - an unreadable or unsafe file, reported in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ChainError(f"{path}: not a weights-only torch file ({first}); refused") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ChainError(f"{path}: expected a mapping of tensor names to tensors; refused")
    return {str(k): list(v.shape) for k, v in state.items()}


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """The tensors' shapes in a safetensors file, from its header alone (8 bytes little-endian: the header's
    length; then that much JSON), without reading the tensors; each tensor's bytes (`data_offsets`) must hold its
    shape and dtype, and the tensors must cover the data that follows exactly, as safetensors requires to load."""
    size = path.stat().st_size
    with path.open("rb") as f:
        start = f.read(8)
        length = int.from_bytes(start, "little") if len(start) == 8 else -1
        if not 0 < length <= min(SAFETENSORS_HEADER_CAP, size - 8):
            raise ChainError(f"{path}: not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except ValueError:
            header = None
    if not isinstance(header, Mapping):
        raise ChainError(f"{path}: not a safetensors file (unreadable header)")
    shapes, covered = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, Mapping) else None
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise ChainError(f"{path}: not a safetensors file (tensor {name!r:.40} has no shape)")
        offsets, width = entry.get("data_offsets"), SAFETENSORS_DTYPE_BYTES.get(str(entry.get("dtype")))
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
            and 0 <= offsets[0] <= offsets[1]
            and width is not None
            and offsets[1] - offsets[0] == width * math.prod(shape)
        ):
            raise ChainError(
                f"{path}: tensor {name!r:.40}'s bytes {offsets!r:.40} do not hold its shape {shape!r:.40} of "
                f"{entry.get('dtype')!r:.12}; refused"
            )
        shapes[str(name)] = shape
        covered = max(covered, offsets[1])
    if covered != size - 8 - length:
        raise ChainError(f"{path}: its tensors take {covered} bytes, the file holds {size - 8 - length}; refused")
    return shapes
