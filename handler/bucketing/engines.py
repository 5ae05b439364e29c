"""Forward-pass engines: the model's output from padded ids and mask (for embeddings, the module chain of a
sentence-transformers folder after the encoder: its pooling over a pooling mask, then its Dense layers; for
classification, the logits), as float32 numpy, on the CPU or the worker's GPU.

- `torch`: the Hugging Face model, eager or traced with TorchScript (the trace is checked against eager at load
  and dropped on any mismatch: both give the same numbers, the trace only faster);
- `onnxruntime`: the graph exported when the archive was built (`model.onnx`, dynamic batch and sequence axes),
  checked at load against the torch model on padded inputs; a difference over 1e-5, or any failure, stops the
  worker with a start-up error (never a silent switch to another numeric path).

A worker runs on `cuda:<gpu_id>` when TorchServe gave it a GPU (`gpu_id` in its system properties) and CUDA is
there, else on the CPU; `dtype` other than float32 runs on the torch engine (float16 on CUDA; bfloat16 on CUDA or a
CPU that multiplies it natively), its encoder in that dtype and the pooling and Dense after it in float32, with its
fidelity to float32 measured at load (`precision`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from . import precision
from .chain import Chain, ChainError, read_chain, read_prompts
from .config import ENGINES, ConfigError, HandlerConfig

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
# The attention the ONNX graph is exported from: eager has no IsNaN/Where mask subgraph, and measured 1.05x the
# SDPA export's req/s through TorchServe (README; `python -m bench.attention_export`).
ONNX_ATTENTION = "eager"
TOLERANCE = 1e-5  # max abs difference of pooled outputs between an engine and the torch model
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Encoders whose position ids start after the padding index: max_position_embeddings - pad_token_id - 1 usable.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet")


class EngineError(RuntimeError):
    """An engine that cannot serve this model exactly: the worker does not start."""


class Engine(Protocol):
    name: str
    device: str

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelInfo:
    """What the handler needs to know of the model besides its weights."""

    max_positions: int
    hidden_size: int
    labels: tuple[str, ...]
    vocab_size: int
    activation: str = "softmax"  # classification: how logits become scores (protocols.base.ACTIVATIONS)
    chain: Chain = Chain()  # embedding: the sentence-transformers module chain (a plain folder: mean pooling);
    # classification: a CrossEncoder's prompts alone


class Head(torch.nn.Module):
    """The model and what follows it: for embeddings, the chain's pooling (over `pool_mask`: the real tokens,
    less any prompt tokens the chain leaves out) and Dense layers; for classification, the logits."""

    def __init__(
        self, model: torch.nn.Module, pooled: bool, chain: Chain | None = None, dense: Sequence[torch.nn.Module] = ()
    ) -> None:
        super().__init__()
        self.model = model
        self.pooled = pooled
        self.masks: Callable[[torch.Tensor], Any] | None = None  # for export: attention masks from plain tensor ops
        self.modes = tuple((chain or Chain()).pooling)
        self.dense = torch.nn.ModuleList(dense)
        # A classifier of text pairs takes token types (BERT's segments) where its model has more than one.
        self.types = not pooled and takes_token_types(model)
        self.inputs = (
            "input_ids",
            "attention_mask",
            *(("pool_mask",) if pooled else ()),
            *(("token_type_ids",) if self.types else ()),
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`extra`: the pooling mask (embeddings) or the token types (a pair classifier)."""
        attention = attention_mask if self.masks is None else self.masks(attention_mask)
        if not self.pooled:
            kwargs = {"token_type_ids": extra} if self.types and extra is not None else {}
            return self.model(input_ids=input_ids, attention_mask=attention, return_dict=False, **kwargs)[0]
        out = self.model(input_ids=input_ids, attention_mask=attention, return_dict=False)[0]
        if out.dtype != torch.float32:  # a reduced-precision encoder: pooling and Dense stay float32
            out = out.float()
        mask = attention_mask if extra is None else extra
        pooled = torch.cat([pool(mode, out, mask, attention_mask) for mode in self.modes], dim=-1)
        for layer in self.dense:
            pooled = layer(pooled)
        return pooled


def takes_token_types(model: torch.nn.Module) -> bool:
    """Whether the model reads token types that can differ (BERT: 2; RoBERTa, XLM-R: 1; DistilBERT: none)."""
    import inspect

    accepts = "token_type_ids" in inspect.signature(model.forward).parameters
    return accepts and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1


def pool(mode: str, tokens: torch.Tensor, mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One sentence-transformers pooling mode over the rows' `mask`ed tokens (right-padded rows), as it computes
    it: cls (the first pooled token), max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken."""
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    if mode == "cls":
        first = mask.to(torch.int32).argmax(dim=1)
        return torch.gather(tokens, 1, first.view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])).squeeze(1)
    if mode == "max":
        return tokens.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode in ("mean", "mean_sqrt_len_tokens"):
        total = (tokens * weights).sum(dim=1)
        count = torch.clamp(weights.sum(dim=1), min=1e-9)
        return total / (count if mode == "mean" else torch.sqrt(count))
    if mode == "weightedmean":
        positions = torch.arange(1, tokens.shape[1] + 1, device=tokens.device, dtype=tokens.dtype).view(1, -1, 1)
        start = attention_mask.to(torch.int32).argmax(dim=1).to(tokens.dtype).view(-1, 1, 1)  # 0: right padding
        weighted = weights * (positions - start)
        return (tokens * weighted).sum(dim=1) / torch.clamp(weighted.sum(dim=1), min=1e-9)
    if mode == "lasttoken":
        length = tokens.shape[1]
        values, indices = mask.to(torch.int32).flip(1).max(1)
        indices = torch.where(values == 0, length - 1, indices)
        last = (length - indices - 1).view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
        return torch.gather(tokens * weights, 1, last).squeeze(1)
    raise EngineError(f"pooling mode {mode!r} is not served")


def dense_layers(model_dir: str, chain: Chain) -> list[torch.nn.Module]:
    """The chain's Dense modules as torch layers: Linear (weights from the module's folder), then activation."""
    import importlib

    layers: list[torch.nn.Module] = []
    for d in chain.dense:
        folder = Path(model_dir) / d.path
        if (folder / "model.safetensors").is_file():
            from safetensors.torch import load_file

            state = load_file(str(folder / "model.safetensors"))
        else:
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        state = {k.removeprefix("linear."): v for k, v in state.items()}
        held = {k: list(v.shape) for k, v in state.items()}
        if held != d.shapes():  # before allocating the layer its config declares
            raise EngineError(f"module Dense in {folder}: config.json declares {d.shapes()}, its weights hold {held}")
        linear = torch.nn.Linear(d.in_features, d.out_features, bias=d.bias)
        linear.load_state_dict(state)
        module, _, name = d.activation.rpartition(".")
        activation = getattr(importlib.import_module(module), name)()
        layers.append(torch.nn.Sequential(linear, activation))
    return layers


def load_head(task: str, model_dir: str, attention: str | None = None) -> tuple[Head, ModelInfo]:
    """The Hugging Face model for the task, in eval mode, with what the handler needs to know of it (`attention`:
    the attention implementation to load it with; None: transformers' default, SDPA)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task == "classification" else AutoModel
    extra = {"attn_implementation": attention} if attention else {}
    model = auto.from_pretrained(model_dir, **extra).eval()
    cfg = model.config
    positions = usable_positions(cfg)
    try:
        labels = class_labels(cfg)
        chain = read_chain(model_dir) if task != "classification" else read_prompts(model_dir)
    except (ValueError, ChainError) as e:
        raise EngineError(f"{model_dir}: {e}") from None
    dims = chain.dimensions(int(cfg.hidden_size))
    info = ModelInfo(positions, dims, labels, int(cfg.vocab_size), activation(cfg, model_dir), chain)
    head = Head(model, pooled=task != "classification", chain=chain, dense=dense_layers(model_dir, chain))
    return head.eval(), info


def class_labels(config: Any) -> tuple[str, ...]:
    """A classifier's label names in logit order; duplicate names are a ValueError (one score each is kept)."""
    id2label = {int(k): v for k, v in (config.id2label or {}).items()}
    labels = tuple(str(id2label.get(i, f"LABEL_{i}")) for i in range(int(config.num_labels)))
    twice = sorted({name for name in labels if labels.count(name) > 1})
    if twice:
        raise ValueError(
            f"config.json id2label names {', '.join(map(repr, twice))} for more than one class; "
            "give every class its own name in id2label (e.g. LABEL_0, LABEL_1, ...)"
        )
    return labels


# A CrossEncoder's config names its activation by class (sentence_transformers.activation_fn).
CROSS_ENCODER_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}


def activation(config: Any, model_dir: str | Path | None = None) -> str:
    """How a classifier's logits become scores: a CrossEncoder's as CrossEncoder decides it (its saved
    `activation_fn`, in config_sentence_transformers.json or config.json's `sentence_transformers`; else sigmoid
    for one label, identity otherwise); any other classifier as Hugging Face's text-classification pipeline does
    (sigmoid for one label or a multi-label model, softmax over the labels otherwise)."""
    st = _json_file(Path(model_dir) / "config_sentence_transformers.json") if model_dir else {}
    named = str(
        st.get("activation_fn") or (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") or ""
    )
    if named:
        short = named.rsplit(".", 1)[-1]
        if short not in CROSS_ENCODER_ACTIVATIONS:
            raise EngineError(
                f"the model's activation_fn {named!r} is not served; served: {', '.join(CROSS_ENCODER_ACTIVATIONS)}"
            )
        return CROSS_ENCODER_ACTIVATIONS[short]
    if st.get("model_type") == "CrossEncoder":
        return "sigmoid" if int(config.num_labels) == 1 else "identity"
    if int(config.num_labels) == 1 or getattr(config, "problem_type", None) == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def _json_file(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def usable_positions(config: Any) -> int:
    """Tokens a model takes: max_position_embeddings, less the offset of RoBERTa-style position ids."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in OFFSET_POSITIONS and getattr(config, "pad_token_id", None) is not None:
        positions -= int(config.pad_token_id) + 1
    return positions


def select_device(gpu_id: Any, cuda_available: bool) -> str:
    """`cuda:<gpu_id>` when TorchServe gave the worker a GPU and CUDA is there, else `cpu`."""
    if gpu_id is None or gpu_id == "" or not cuda_available:
        return "cpu"
    return f"cuda:{int(gpu_id)}"


def check_dtype(config: HandlerConfig, device: str) -> torch.dtype:
    if device == "cpu":
        precision.check_cpu_dtype(config.dtype, precision.cpu_info())
    if config.dtype != "float32" and ENGINE_KINDS[config.engine].float32_only:
        raise ConfigError(
            f"handler.dtype: got {config.dtype!r} with handler.engine {config.engine}; allowed: float32 "
            f"(the {config.engine} engine runs float32 only; use engine: torch for float16/bfloat16)"
        )
    return DTYPES[config.dtype]


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


class TorchEngine:
    """The model on torch, eager or traced with TorchScript."""

    name = "torch"
    fidelity: precision.Fidelity | None = None  # a reduced dtype's, measured against float32 at load

    def __init__(self, head: Head, device: str, dtype: torch.dtype, torchscript: bool, vocab_size: int) -> None:
        self.device = device
        self.head = head.to(device)
        self.head.model.to(dtype=dtype)  # the encoder only: pooling and Dense after it stay float32
        self.traced: torch.jit.ScriptModule | None = self._trace(vocab_size) if torchscript else None

    def _run(self, module: Any, *arrays: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(*(torch.from_numpy(a).to(self.device) for a in arrays))
            return out.float().cpu().numpy()

    def _trace(self, vocab_size: int) -> torch.jit.ScriptModule | None:
        ids, mask, pool_mask = probe(vocab_size)
        inputs = head_inputs(self.head, ids, mask, pool_mask, probe_types(mask))
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                first = torch.from_numpy(inputs[0][:2, :16]).to(self.device)
                ones = torch.ones((2, 16), dtype=torch.long, device=self.device)
                traced = torch.jit.trace(self.head, (first, *[ones] * (len(inputs) - 1)), strict=False)
            diff = float(np.abs(self._run(traced, *inputs) - self._run(self.head, *inputs)).max())
            if diff > TOLERANCE:
                raise ValueError(f"traced output differs from eager by {diff:.2e}")
            return traced
        except Exception as e:  # noqa: BLE001 - tracing is an optimisation; eager gives the same numbers
            logger.warning("TorchScript trace unusable (%s: %s); using the eager model", type(e).__name__, str(e)[:200])
            return None

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        module = self.traced if self.traced is not None else self.head
        return self._run(module, *head_inputs(self.head, ids, mask, pool_mask, types))


def head_inputs(
    head: Head, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
) -> tuple:
    """What a head takes, in its order: ids and mask; for embeddings the pooling mask (the attention mask unless
    told); for a pair classifier the token types (zeros unless told)."""
    if head.pooled:
        return ids, mask, mask if pool_mask is None else pool_mask
    if head.types:
        return ids, mask, np.zeros_like(ids) if types is None else types
    return ids, mask


class OrtEngine:
    """The exported graph on ONNX Runtime: the CUDA provider on a GPU worker when it is there, else the CPU's."""

    name = "onnxruntime"

    def __init__(self, path: Path, threads: int, device: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.split(":")[1])}))
            else:
                logger.warning("a GPU worker, but this onnxruntime has no CUDA provider: running on the CPU")
                device = "cpu"
        self.device = device
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        feed = {
            "input_ids": ids,
            "attention_mask": mask,
            "pool_mask": mask if pool_mask is None else pool_mask,
            "token_type_ids": np.zeros_like(ids) if types is None else types,
        }
        return self.session.run(None, {name: feed[name] for name in self.inputs})[0]


def export_onnx(task: str, model_dir: str, path: Path) -> Path:
    """Export the task's head to ONNX with dynamic batch and sequence axes (done when an archive is built), from
    the model loaded with `ONNX_ATTENTION` (the worker checks the graph against torch within TOLERANCE)."""
    head, info = load_head(task, model_dir, ONNX_ATTENTION)
    config: Any = head.model.config
    masks = EXPORT_MASKS.get(config.model_type)
    head.masks = partial(masks, config) if masks is not None else None
    ids, mask, pool_mask = probe(info.vocab_size)
    inputs = head_inputs(head, ids, mask, pool_mask, probe_types(mask))
    names = list(head.inputs)
    axes = {**{name: {0: "batch", 1: "sequence"} for name in names}, "output": {0: "batch"}}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                head,
                tuple(torch.from_numpy(a) for a in inputs),
                str(path),
                input_names=names,
                output_names=["output"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
    except Exception as e:  # noqa: BLE001 - a model the exporter cannot take: one line, and what serves it
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise EngineError(
            f"{model_dir}: the ONNX export of this {config.model_type} model failed ({type(e).__name__}: {first}); "
            "build it with --engine torch, which serves it exactly"
        ) from None
    head.masks = None  # the reference: transformers' own masks
    check_export(head, info, path, getattr(config, "sliding_window", None))
    return path


def check_export(head: Head, info: ModelInfo, path: Path, window: int | None) -> None:
    """The exported graph against the torch head on padded rows long enough to cross the model's sliding window
    (if any), so the graph's masks are checked where the window bites; an EngineError past TOLERANCE."""
    length = min(info.max_positions, 2 * window + 8) if window else 24
    rng = np.random.default_rng(1)
    ids = rng.integers(min(1000, info.vocab_size // 2), info.vocab_size, size=(3, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, length // 2 :] = 0
    mask[2, length - 3 :] = 0
    try:
        got = OrtEngine(path, 1, "cpu")(ids, mask, mask, probe_types(mask))
        diff = float(
            np.abs(
                got
                - TorchEngine(head, "cpu", torch.float32, False, info.vocab_size)(ids, mask, mask, probe_types(mask))
            ).max()
        )
    except Exception as e:  # noqa: BLE001 - reported in one line
        diff, why = float("nan"), f" ({type(e).__name__}: {str(e).strip()[:160]})"
    else:
        why = ""
    if not diff <= TOLERANCE:
        raise EngineError(
            f"the exported ONNX graph differs from the torch model by {diff:.2e} at {length} tokens{why}; "
            "build it with --engine torch, which serves it exactly"
        )


def window_masks(config: Any, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gemma3's attention masks by layer type, from plain tensor ops (transformers' mask functions do not export to
    ONNX): every real token (causal: every earlier one) for full attention, those within `sliding_window` for
    sliding attention; additive float32 masks, as eager attention takes them."""
    n = attention_mask.shape[1]
    positions = torch.arange(n, device=attention_mask.device)
    distance = positions.view(-1, 1) - positions.view(1, -1)  # query - key
    keep = attention_mask.bool().view(-1, 1, 1, n)
    window = int(config.sliding_window)
    if getattr(config, "use_bidirectional_attention", False):
        full, near = keep, keep & (distance.abs() < window)
    else:
        full, near = keep & (distance >= 0), keep & (distance >= 0) & (distance < window)
    low = torch.finfo(torch.float32).min  # the exported graph runs float32
    return {
        "full_attention": torch.where(full, 0.0, low).expand(-1, 1, n, n),
        "sliding_attention": torch.where(near, 0.0, low).expand(-1, 1, n, n),
    }


# Models whose exported graph takes its attention masks from `Head.masks` (by config.model_type).
EXPORT_MASKS: dict[str, Callable[[Any, torch.Tensor], Any]] = {"gemma3_text": window_masks}


def open_torch(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    return TorchEngine(head, device, dtype, config.torchscript, info.vocab_size)


def open_onnxruntime(
    head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any
) -> Engine:
    """The exported graph, checked against the torch model on padded inputs (an EngineError past TOLERANCE)."""
    path = Path(model_dir) / ONNX_FILE
    if not path.exists():
        raise EngineError(
            f"handler.engine onnxruntime: no {ONNX_FILE} in {model_dir}; build the archive with "
            "`python -m model_store.build --engine onnxruntime` (it exports the graph)"
        )
    try:
        engine = OrtEngine(path, config.torch_threads, device)
        ids, mask, pool_mask = probe(info.vocab_size)
        reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)(
            ids, mask, pool_mask, probe_types(mask)
        )
        diff = float(np.abs(engine(ids, mask, pool_mask, probe_types(mask)) - reference).max())
    except Exception as e:
        raise EngineError(
            f"handler.engine onnxruntime: {path} could not be checked against the torch model "
            f"({type(e).__name__}: {str(e)[:300]})"
        ) from e
    if not diff <= TOLERANCE:
        raise EngineError(
            f"handler.engine onnxruntime: {path} differs from the torch model by {diff:.2e} on padded "
            f"inputs (allowed: {TOLERANCE:g}); rebuild the archive from this model"
        )
    logger.info("onnxruntime engine checked against torch: max abs diff %.1e", diff)
    return engine


@dataclass(frozen=True)
class EngineKind:
    """An engine as the handler and the archive builder see it: how it opens, and what its archive carries."""

    name: str
    open: Callable[[Head, ModelInfo, HandlerConfig, str, str, Any], Engine]  # head, info, config, folder, device, dtype
    files: tuple[str, ...] = ()  # what it reads beside the model's files; `prepare` writes them at build time
    prepare: Callable[[str, str, Path], Path] | None = None  # (task, model folder, target file)
    float32_only: bool = False

    def prepare_into(self, task: str, model_dir: str, folder: Path) -> None:
        """Write the files this engine needs into the archive's model folder."""
        if self.prepare is not None:
            for name in self.files:
                self.prepare(task, model_dir, folder / name)


# The engines, by `handler.engine` name: adding one is its class, its `open`, and a line here (and in ENGINES).
ENGINE_KINDS = {
    kind.name: kind
    for kind in (
        EngineKind("torch", open_torch),
        EngineKind("onnxruntime", open_onnxruntime, (ONNX_FILE,), export_onnx, float32_only=True),
    )
}
assert tuple(ENGINE_KINDS) == ENGINES, "bucketing.config.ENGINES and engines.ENGINE_KINDS must name the same engines"


def load_engine(config: HandlerConfig, model_dir: str, gpu_id: Any = None) -> tuple[Engine, ModelInfo]:
    """The configured engine for the model, checked; and what the handler needs to know of the model."""
    device = select_device(gpu_id, torch.cuda.is_available())
    dtype = check_dtype(config, device)
    head, info = load_head(config.task, model_dir)
    if dtype == torch.float32:
        return ENGINE_KINDS[config.engine].open(head, info, config, model_dir, device, dtype), info
    return open_reduced(head, info, config, model_dir, device, dtype), info


def open_reduced(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    """The torch engine in a reduced dtype, its fidelity to the float32 model measured on `precision.PROBE_TEXTS`
    (an EngineError below `handler.min_cosine`)."""
    from .tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir, min(config.max_length, info.max_positions), bool(info.chain.do_lower_case))
    probes = precision.probe_inputs(tokenizer, pairs=config.task == "classification")
    reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)(*probes)
    engine = TorchEngine(head, device, dtype, config.torchscript, info.vocab_size)
    engine.fidelity = precision.measure(config.dtype, reference, engine(*probes), config.task, info.activation)
    refusal = engine.fidelity.refusal(config.min_cosine)
    if refusal:
        raise EngineError(refusal)
    return engine
