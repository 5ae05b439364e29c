"""The model head: what is computed from the encoder's output, whatever engine runs the graph.

For embeddings, the module chain of a sentence-transformers folder after the encoder (its pooling over a pooling
mask, then its Dense layers, each checked against its weights before anything is allocated); for classification,
the logits, with the labels and the activation that turns them into scores. `load_head` opens the Hugging Face model
with its head; `engines` runs it (torch, onnxruntime, openvino) on a device and in a dtype.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bucketing.engine_registry import DTYPE_KINDS, EXACT_DTYPE
from bucketing.engine_registry import EngineError as EngineError  # declared with the engines; raised here too
from bucketing.model.chain import (
    Chain,
    ChainError,
    check_dense_weights,
    read_chain,
    read_prompts,
    transformer_folder,
)
from bucketing.model.weights import check_weight_shapes
from bucketing.model_kinds import MODEL_KINDS

# Encoders whose position ids start after the padding index: max_position_embeddings - pad_token_id - 1 usable.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet")
# Encoder-decoder architectures whose encoder sentence-transformers (6.2, `_ENCODER_ONLY_MODELS`) loads alone, by
# config.model_type: served with the encoder class it loads (a sentence-t5 / GTR folder: T5EncoderModel; AutoModel
# would load the whole T5 with a random decoder), each checked against its encode() (tests/handler/
# test_model_layouts.py); the rest of its list is refused in one line (ENCODER_ONLY_REFUSED).
ENCODER_ONLY = {
    "t5": "T5EncoderModel",
    "mt5": "MT5EncoderModel",
    "umt5": "UMT5EncoderModel",
    "longt5": "LongT5EncoderModel",
}
ENCODER_ONLY_REFUSED = (
    "udop",
    "prophetnet",
    "switch_transformers",
    "blenderbot",
    "blenderbot-small",
    "m2m_100",
    "pegasus",
    "pegasus_x",
    "moonshine",
    "whisper",
    "marian",
    "t5gemma",
    "t5gemma2",
    "t5gemma2_text",
)
# Encoders with relative positions (T5's position buckets) have no table of positions, hence no limit of their own:
# sentence-transformers cuts their texts where max_seq_length, else the tokenizer's model_max_length, says.
RELATIVE_POSITIONS = tuple(ENCODER_ONLY)
UNBOUNDED_POSITIONS = 1 << 30  # `usable_positions` of such an encoder: no limit below the handler's own


@dataclass(frozen=True)
class ModelInfo:
    """What the handler needs to know of the model besides its weights."""

    max_positions: int
    hidden_size: int
    labels: tuple[str, ...]
    vocab_size: int
    activation: str = "softmax"  # classification: how logits become scores (answers.ACTIVATIONS)
    chain: Chain = Chain()  # embedding: the sentence-transformers module chain (a plain folder: mean pooling);
    # classification: a CrossEncoder's prompts alone
    folder: str = ""  # the transformer's own folder, where its tokenizer lives ("": the model folder)


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
            logits: torch.Tensor = self.model(
                input_ids=input_ids, attention_mask=attention, return_dict=False, **kwargs
            )[0]
            return logits
        return self.states(input_ids, attention_mask, extra)[0]

    def states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """An embedding model's pooled outputs (as `forward`) and the encoder's token embeddings (float32)."""
        attention = attention_mask if self.masks is None else self.masks(attention_mask)
        out = self.model(input_ids=input_ids, attention_mask=attention, return_dict=False)[0]
        if out.dtype != torch.float32:  # a reduced-precision encoder: pooling and Dense stay float32
            out = out.float()
        mask = attention_mask if pool_mask is None else pool_mask
        pooled = torch.cat([pool(mode, out, mask, attention_mask) for mode in self.modes], dim=-1)
        for layer in self.dense:
            pooled = layer(pooled)
        return pooled, out


class WithStates(torch.nn.Module):
    """An embedding head exported with two outputs: its pooled outputs, and the encoder's token embeddings (what
    late chunking pools over spans; onnxruntime computes the second only when asked for it)."""

    def __init__(self, head: Head) -> None:
        super().__init__()
        self.head = head

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.states(input_ids, attention_mask, pool_mask)


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
        file = "model.safetensors" if (folder / "model.safetensors").is_file() else "pytorch_model.bin"
        if file == "model.safetensors":
            from safetensors.torch import load_file

            state = load_file(str(folder / file))
        else:
            state = torch.load(folder / file, map_location="cpu", weights_only=True)
        state = {k.removeprefix("linear."): v for k, v in state.items()}
        try:  # as the chain was read; again here, before allocating the layer its config declares
            check_dense_weights(folder, d, file, {k: list(v.shape) for k, v in state.items()})
        except ChainError as e:
            raise EngineError(str(e)) from None
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

    from bucketing.model_kinds import refused_folder

    kind = MODEL_KINDS[task]
    if kind.own_head:
        own: tuple[Head, ModelInfo] = kind.implementation().load_head(model_dir, attention)
        return own
    other = refused_folder(kind, model_dir)
    if other is not None:
        raise EngineError(
            f"{model_dir}: a {other.saved_as} folder ({other.note}); serve it with handler.task "
            f"{other.name} (`model_store.build --task {other.name}`, or let the build detect it)"
        )
    classifier = MODEL_KINDS[task].classifier
    try:  # first: a module the chain cannot serve (a dense Router) is its own line, whatever the folder lacks
        chain = read_chain(model_dir) if not classifier else read_prompts(model_dir)
        body = transformer_folder(model_dir) if not classifier else Path(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    extra = {"attn_implementation": attention} if attention else {}
    if classifier:
        model = load_pretrained(AutoModelForSequenceClassification, body, **extra)
    else:
        model = load_encoder(body, AutoModel, **extra)
    cfg = model.config
    positions = usable_positions(cfg)
    try:
        labels = class_labels(cfg)
    except ValueError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    dims = chain.dimensions(int(cfg.hidden_size))
    info = ModelInfo(positions, dims, labels, int(cfg.vocab_size), activation(cfg, model_dir), chain, str(body))
    head = Head(model, pooled=not classifier, chain=chain, dense=dense_layers(model_dir, chain))
    return head.eval(), info


def load_pretrained(auto: Any, folder: str | Path, **extra: Any) -> Any:
    """`auto.from_pretrained(folder)` in eval mode, once config.json's shapes are checked against the weights'
    headers (every kind loads its transformer here): a mismatch is an EngineError in one line, before anything of
    the sizes config.json declares is allocated."""
    try:
        check_weight_shapes(auto, folder)
    except ChainError as e:
        raise EngineError(str(e)) from None
    return auto.from_pretrained(folder, **extra).eval()


def encoder_only(config: Any) -> str | None:
    """The transformers class sentence-transformers loads this encoder-decoder's encoder alone with (`ENCODER_ONLY`;
    None: not such a model, loaded as AutoModel); EngineError in one line for one of its list not served here."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in ENCODER_ONLY_REFUSED:
        raise EngineError(
            f"architecture {model_type!r} is an encoder-decoder whose encoder sentence-transformers loads alone, "
            f"which this handler does for {', '.join(ENCODER_ONLY)} only (each checked against its encode()); "
            "this model cannot be served exactly"
        )
    return ENCODER_ONLY.get(model_type)


def load_encoder(folder: str | Path, auto: Any, **extra: Any) -> Any:
    """An embedding model's transformer as sentence-transformers loads it: the encoder alone of an encoder-decoder
    it loads so (`encoder_only`: T5EncoderModel, a decoder's saved tensors ignored), else `auto` (AutoModel)."""
    import transformers
    from transformers import AutoConfig

    try:
        name = encoder_only(AutoConfig.from_pretrained(folder))
    except EngineError as e:
        raise EngineError(f"{folder}: {e}") from None
    except Exception:  # noqa: BLE001 - a config transformers cannot read: from_pretrained reports it itself
        name = None
    if name is None:
        return load_pretrained(auto, folder, **extra)
    encoder = getattr(transformers, name)
    ignored = encoder.__dict__.get("_keys_to_ignore_on_load_unexpected")
    encoder._keys_to_ignore_on_load_unexpected = ["decoder.*"]  # as sentence-transformers loads it: no report
    try:
        return load_pretrained(encoder, folder, **extra)
    finally:
        if ignored is None:
            del encoder._keys_to_ignore_on_load_unexpected
        else:
            encoder._keys_to_ignore_on_load_unexpected = ignored


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

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def usable_positions(config: Any) -> int:
    """Tokens a model takes: max_position_embeddings, less the offset of RoBERTa-style position ids; a relative-
    position encoder's (T5): no limit of its own (`UNBOUNDED_POSITIONS`)."""
    if config.model_type in RELATIVE_POSITIONS and getattr(config, "max_position_embeddings", None) is None:
        return UNBOUNDED_POSITIONS
    positions = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in OFFSET_POSITIONS and getattr(config, "pad_token_id", None) is not None:
        positions -= int(config.pad_token_id) + 1
    return positions


REDUCED_SAVED = tuple(d.name for d in DTYPE_KINDS.values() if d.reduced)  # float16, bfloat16


def saved_dtype(config: Any) -> str:
    """The dtype a model's weights were saved in, as its config.json says (float32 when it says none)."""
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or EXACT_DTYPE
    return str(saved).removeprefix("torch.")


def reduced_weights(model_dir: str | Path, saved: str) -> str:
    """Why a folder whose weights are saved in a reduced dtype is not served in float32, in one line."""
    return (
        f"{model_dir}: its weights are saved in {saved}, and sentence-transformers runs them in {saved}, so float32 "
        f"answers would differ from encode(): save a float32 copy (`SentenceTransformer(dir).float().save(new_dir)`) "
        f"and serve that, or serve it with handler.dtype {saved} (--dtype) where that is served, knowingly"
    )
