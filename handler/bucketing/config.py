"""Typed handler configuration, read once from model-config.yaml's `handler:` section.

One declaration per key: the dataclass field carries its default, its allowed values and its documentation;
the validator and the settings reference's table (docs/configuration/settings.md,
`python -m bucketing.settings_reference`) are both built from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from bucketing import sizes
from bucketing.engine_registry import DEFAULT_ENGINE, EXACT_DTYPE, DType, EngineName
from bucketing.engine_registry import DTYPES as DTYPES  # the dtypes and engines, one declaration each
from bucketing.engine_registry import ENGINE_NAMES as ENGINE_NAMES
from bucketing.model_kinds import MODEL_KINDS, KindName

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TASKS: tuple[KindName, ...] = tuple(k.name for k in MODEL_KINDS.values())  # one declaration each in model_kinds.py
StrategyName = Literal["bucketed", "dynamic", "static"]  # `handler.strategy`
ScheduleName = Literal["batch", "continuous"]  # `handler.schedule`


@dataclass(frozen=True)
class Strategy:
    """A planning strategy (`handler.strategy`), declared once: the planner, the start-up checks and the bench read
    what it does here, never its name."""

    name: StrategyName
    budgeted: bool = False  # sorted sub-batches under max_batch_tokens, by the cost model (calibrated at start)
    pads_to_max_length: bool = False  # every pass padded to max_length (else to its longest row, rounded up)

    @property
    def pads_to_longest(self) -> bool:
        """Each pass padded to its longest row: a pass of one text is then the same under every such strategy."""
        return not self.pads_to_max_length


@dataclass(frozen=True)
class Schedule:
    """A schedule (`handler.schedule`), declared once: the worker, the build and the bench read what it does here."""

    name: ScheduleName
    pools: bool = False  # texts pool across TorchServe calls (its continuousBatching aggregator, one worker a model)


STRATEGY_RULES: dict[str, Strategy] = {  # by name (a str key: the build and the bench look names up)
    s.name: s
    for s in (Strategy("bucketed", budgeted=True), Strategy("dynamic"), Strategy("static", pads_to_max_length=True))
}
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)
SCHEDULE_RULES: dict[str, Schedule] = {s.name: s for s in (Schedule("batch"), Schedule("continuous", pools=True))}
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
# A text over max_length, by `on_overflow`: (whether it is cut, whether it is split into windows); neither: a 413.
OVERFLOW_RULES = {"truncate": (True, False), "reject": (False, False), "chunk": (False, True)}
OVERFLOW = tuple(OVERFLOW_RULES)
NORMALIZE = ("auto", "true", "false")  # YAML's true/false are read as "true"/"false"

# The largest position count of BERT-family encoders; the model's own limit is checked at load.
MAX_LENGTH_CAP = 8192


class ConfigError(ValueError):
    """A bad value in the `handler:` section; the message names the key, the value and what is allowed."""


def option(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    """A config key: its default, what is allowed (choices, or a range for numbers) and its documentation."""
    metadata = {"doc": doc, "choices": choices, "low": low, "high": high}
    if dataclasses.is_dataclass(default) or isinstance(default, dict):
        return field(default_factory=type(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class CostConfig:
    """The planner's cost model: calibrated at worker start, or taken from these constants."""

    calibrate: bool = option(True, "time a few forward passes at worker start (about 2 s) and fit the cost model")
    forward_overhead_us: float = option(
        5000.0,
        "cost model: microseconds per forward pass, when not calibrated (or if calibration fails)",
        low=0.0,
        high=1e7,
    )
    per_token_us: float = option(230.0, "cost model: microseconds per padded token", low=0.0, high=1e6)
    per_token_sq_us: float = option(
        0.2, "cost model: microseconds per padded token x length (attention)", low=0.0, high=1e6
    )


@dataclass(frozen=True)
class HandlerConfig:
    task: KindName = option(
        "embedding",
        "`embedding` (the model's sentence-transformers chain; mean pooling for a plain "
        "folder), `classification` (id2label scores: softmax; sigmoid for one label or multi-label), `sparse` (a "
        "sentence-transformers SparseEncoder: SPLADE, static, a query/document Router, CSR; float32, either engine) or "
        "`multivector` (a MultiVectorEncoder folder: one vector per kept token)",
        choices=TASKS,
    )
    strategy: StrategyName = option(
        "bucketed",
        "`bucketed` (sorted sub-batches under a token budget), `dynamic` (one pass "
        "padded to the longest text) or `static` (padded to max_length)",
        choices=STRATEGIES,
    )
    schedule: ScheduleName = option(
        "batch",
        "`batch` (every request of TorchServe's batch answered in the call) or `continuous` (with the "
        "model-config's `continuousBatching: true`: texts pool across calls; each call runs about `slice_ms` "
        "of passes and answers the requests that are done, so new ones join without waiting for the rest)",
        choices=SCHEDULES,
    )
    slice_ms: float = option(
        40.0, "`continuous`: estimated milliseconds of passes per call (at least one pass)", low=1.0, high=60000.0
    )
    max_wait_ms: float = option(
        250.0,
        "`continuous`: a request that has waited this long since it last ran goes first (shortest first "
        "otherwise); a call that brought no new request runs up to this much of passes",
        low=0.0,
        high=600000.0,
    )
    model_path: str = option("model", "folder of the model inside the archive (or an absolute path)")
    max_length: int = option(
        256,
        "tokens per text, special tokens included: at most where sentence-transformers cuts the model's texts (its "
        "`max_seq_length`, else its tokenizer's `model_max_length`, within its positions), which `model_store.build "
        "--model-dir` writes; a smaller one is said in the worker's ready line",
        low=1,
        high=MAX_LENGTH_CAP,
    )
    on_overflow: str = option(
        "truncate",
        "a text over max_length: `truncate` (the answer says `truncated: true`), `reject` (413) or `chunk` "
        "(embedding models: split into windows of its own tokens, each run as its own row, their pooled vectors "
        "averaged by their text tokens, then normalised; the answer says `chunks`); a request may say otherwise "
        "(`on_overflow`, or `truncate`)",
        choices=OVERFLOW,
    )
    chunk_tokens: int = option(
        0,
        "`chunk`: a window's own tokens (0: as many as max_length leaves after the special tokens and the prompt; "
        "never more)",
        low=0,
        high=MAX_LENGTH_CAP,
    )
    chunk_overlap: int = option(
        0,
        "`chunk`: tokens each window repeats from the end of the one before it (fewer than a window's)",
        low=0,
        high=MAX_LENGTH_CAP,
    )
    max_chunks: int = option(
        32,
        "`chunk`: windows of one text at most (a longer text is a 413 naming this key; bounds a text's cost: "
        "the tokenizer reads at most the characters these windows hold)",
        low=1,
        high=1024,
    )
    max_texts_per_request: int = option(
        sizes.MAX_TEXTS,
        "texts of one request (`texts`, `instances`, v2 `data`, OpenAI "
        "`input`; OpenAI's own limit), spread over passes under `max_batch_tokens`; checked at start-up against "
        "`max_response_bytes`",
        low=1,
        high=4096,
    )
    max_response_bytes: int = option(
        sizes.RESPONSE_BYTES,
        "largest answer (default: 2048 float answers 1024 wide, `bucketing/sizes.py`): TorchServe's "
        "`max_response_size` (keep them equal); a larger answer is a 413 naming its "
        "size (never cut), the rest of the batch answered; a multi-vector model's answers grow with their tokens "
        "(refused from their token count, before any pass): one text of `max_length` tokens must fit",
        low=1024,
        high=1 << 31,
    )
    max_batch_tokens: int = option(
        8192,
        "rows x padded length of one forward pass (`bucketed` only); a sparse model's MLM runs in row groups within "
        "it in every strategy (its logits: at most max_batch_tokens x vocabulary floats a pass)",
        low=1,
        high=1 << 22,
    )
    pad_to_multiple_of: int = option(
        1, "round each pass's padded length up to this (checked against the model's positions)", low=1, high=512
    )
    engine: EngineName = option(
        DEFAULT_ENGINE,
        "`torch` (eager, or TorchScript below), `onnxruntime` (the graph exported into "
        "the archive, checked against torch at start-up) or `openvino` (the same graph compiled by OpenVINO for the "
        "CPU, its inference precision always given by `dtype`)",
        choices=ENGINE_NAMES,
    )
    dtype: DType = option(
        EXACT_DTYPE,
        "`float32` (exact); with engine torch or openvino, `bfloat16` on a CPU that multiplies it natively (amx_bf16 "
        "or avx512_bf16; refused elsewhere), with torch on a CUDA GPU too, `float16` on a CUDA GPU: its fidelity to "
        "float32 is measured at start (ready line, `bucket_fidelity_cosine_min`)",
        choices=DTYPES,
    )
    min_cosine: float = option(
        0.999,
        "`dtype` other than float32: the worker refuses to start when its cosine to float32 on its probe set "
        "(prose, digits, punctuation, CJK, unknown-token text, word pieces from across the vocabulary, texts at "
        "max_length; embeddings, a classifier's logits) falls below this; a guarantee on the probe set only "
        "(served texts: `fidelity_sample`)",
        low=0.0,
        high=1.0,
    )
    fidelity_sample: float = option(
        0.0,
        "`dtype` other than float32: the share of served texts also run in float32 in the same call (shadow "
        "checking; costs that share of float32 compute and a float32 copy of the encoder), their cosine in "
        "`bucket_fidelity_sample_cosine` and the minimum in `bucket_fidelity_sample_cosine_min`, a warning logged "
        "below `min_cosine`; answers are unchanged; 0: off",
        low=0.0,
        high=1.0,
    )
    torch_threads: int = option(
        1, "threads per worker, for either engine: 2 workers x 1 thread measured best on 2 cores", low=1, high=256
    )
    capacity_tokens_per_s: float = option(
        0.0,
        "what this model holds on this machine (all its workers) at your p99 target, in tokens per second: the "
        "bench's capacity (`--p99-ms`, req/s) times its mean tokens per request; stated in the ready line and "
        "served as the gauge `bucket_capacity_tokens_per_second`, so `bucket_queue_tokens` over it reads as seconds "
        "of work waiting (an autoscaler's target, docs/operations/autoscaling.md); 0: unknown, no gauge",
        low=0.0,
        high=1e9,
    )
    normalize: str = option(
        "auto",
        "L2-normalise embeddings: `auto` (as the model's sentence-transformers chain says: "
        "when it ends in `Normalize`; a plain Hugging Face folder: yes), `true` or `false` "
        "(a request may still ask with `normalize`)",
        choices=NORMALIZE,
    )
    truncate_dim: int = option(
        0,
        "embeddings: keep the first N components of every answer, as sentence-transformers' `truncate_dim` does "
        "(after the chain's Normalize, not re-normalised; before `precision`); a request's `dimensions` may then ask "
        "at most N (re-normalised, as OpenAI's); 0: the model folder's own (`config_sentence_transformers.json`), "
        "else none (`model_store.build --truncate-dim N`)",
        low=0,
        high=65536,
    )
    torchscript: bool = option(
        True,
        "trace the model with TorchScript at load (about 1 ms less per pass); the "
        "trace is checked against the eager model and dropped on any mismatch",
    )
    prompts: dict[str, str] = option(
        {},
        "prompts by name, added to the model's own (`config_sentence_transformers.json`); a "
        "request picks one with `prompt_name` (`model_store.build --prompt NAME=TEXT`)",
    )
    default_prompt_name: str = option(
        "",
        "the prompt used when a request names none (empty: the model's "
        "`default_prompt_name`, if any; `build --default-prompt NAME`)",
    )
    cost: CostConfig = option(CostConfig(), "the planner's cost model")

    @classmethod
    def from_yaml(cls, model_yaml_config: Any) -> HandlerConfig:
        """Build from the whole model-config.yaml mapping (TorchServe's `context.model_yaml_config`)."""
        if model_yaml_config is None:
            return cls()
        if not isinstance(model_yaml_config, Mapping):
            raise ConfigError(f"model-config: expected a mapping, got {type(model_yaml_config).__name__}")
        section = model_yaml_config.get("handler")
        if section is None:  # no `handler:` key, or one with nothing under it: every default
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError(f"handler: expected a mapping of keys, got {type(section).__name__} {section!r:.40}")
        return cls.from_mapping(section)

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> HandlerConfig:
        config = _build(cls, section, "handler")
        config._check_budget()
        return config

    @property
    def planning(self) -> Strategy:
        """Its strategy's declaration (what the planner and the checks read)."""
        return STRATEGY_RULES[self.strategy]

    @property
    def scheduling(self) -> Schedule:
        """Its schedule's declaration (what the worker reads)."""
        return SCHEDULE_RULES[self.schedule]

    def _check_budget(self) -> None:
        if self.truncate_dim and not MODEL_KINDS[self.task].dense_vector:
            raise ConfigError(
                f"handler.truncate_dim: got {self.truncate_dim} for task {self.task}; allowed: 0 (truncate_dim cuts "
                "a dense embedding, task embedding)"
            )
        longest = -(-self.max_length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        if self.max_batch_tokens < longest:
            raise ConfigError(
                f"handler.max_batch_tokens: got {self.max_batch_tokens}; allowed: at least "
                f"max_length rounded up to pad_to_multiple_of ({longest}), so one text always fits"
            )
        window = min(self.chunk_tokens or self.max_length, self.max_length)
        if self.chunk_overlap >= window:
            raise ConfigError(
                f"handler.chunk_overlap: got {self.chunk_overlap}; allowed: fewer than a window's tokens ({window}: "
                "chunk_tokens, else max_length)"
            )


_Config = TypeVar("_Config", bound="DataclassInstance")


def _build(cls: type[_Config], section: Mapping[str, Any], where: str) -> _Config:
    """A config dataclass from a mapping, each value checked against its field's declaration."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(str(k) for k in section if k not in known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return cls(**{name: _value(known[name], value, f"{where}.{name}") for name, value in section.items()})


def _value(f: dataclasses.Field[Any], value: Any, key: str) -> Any:
    meta = f.metadata
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    if dataclasses.is_dataclass(default) and not isinstance(default, type):  # a nested section's defaults
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: got {value!r}; allowed: a mapping")
        return _build(type(default), value, key)
    if isinstance(default, dict):
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError(f"{key}: got {value!r:.80}; allowed: a mapping of names to texts")
        return dict(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: got {value!r}; allowed: true | false")
        return value
    if isinstance(default, (int, float)):
        kind = int if isinstance(default, int) else (int, float)
        low, high = meta["low"], meta["high"]
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            what = f"an integer from {low} to {high}" if kind is int else f"a number from {low:g} to {high:g}"
            raise ConfigError(f"{key}: got {value!r}; allowed: {what}")
        return value if kind is int else float(value)
    if meta["choices"]:
        if isinstance(value, bool) and "true" in meta["choices"]:  # `normalize: true` in YAML is a boolean
            value = str(value).lower()
        if value not in meta["choices"]:
            raise ConfigError(f"{key}: got {value!r}; allowed: {' | '.join(meta['choices'])}")
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: got {value!r}; allowed: a non-empty string")
    return value
