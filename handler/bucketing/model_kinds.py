"""Model kinds, one declaration each: what differs between an embedding, a classifier, a sparse and a multi-vector
model is read from its `Kind` here, never tested by name elsewhere.

A pure registry on the ground floor (no torch, nothing of the task classes imported at module level): `config`, the
engines, the model's head, the wire formats and the build read it. A kind declares its name (`handler.task`,
`--task`), the task class that serves it (`module:Class` in `bucketing.kinds`, imported when first used), the engines
and dtypes it serves (and its refusal line for others), its answer's fields, how large an answer can be (for the
start-up size check), its line from a wire format that does not answer it (each format declares the kinds it
answers: `Wire.answers`) and a request's options of its own. The task class says the rest, as static methods
(`kinds.task.TaskHooks` holds the defaults): `load` (the task on its engine, read by `kinds.task.load_kind`),
`read_settings` (its sentence-transformers settings, at build), `detects` (whether a folder is of this kind),
`encoder_folder` (where its transformer lives, to check at build), `describe` (what the build records of its chain).
Adding a kind is its module in `bucketing.kinds` and one entry below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from bucketing.engine_registry import SPARSE_ENGINES, either

if TYPE_CHECKING:
    from types import ModuleType

    from bucketing.model.chain import Chain

KindName = Literal["embedding", "classification", "sparse", "multivector", "bgem3"]  # `handler.task`, `--task`
DEFAULT: KindName = "embedding"  # what a folder is served as when no kind detects it
ANSWER_BOUNDS = ("texts", "one_text", "checked")


class Implementation(Protocol):
    """What the registry's readers take of a kind's task class (static methods; `kinds.task.TaskHooks` has the
    defaults). Its `load` returns a task, which only the task side names: `kinds.task.load_kind` reads it."""

    def read_settings(self, folder: Path) -> Chain: ...

    def detects(self, folder: Path | str) -> bool: ...

    def encoder_folder(self, folder: Path) -> tuple[Path, int | None, str] | None: ...

    def describe(self, folder: Path) -> dict[str, Any] | None: ...

    def engine_refusal(self, folder: Path, engine: str) -> str | None: ...

    def load_head(self, model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
        """A kind with `own_head`: its head and the model's facts (as head.load_head gives them)."""
        ...


@dataclass(frozen=True)
class Kind:
    """One model kind, as the handler, the wire formats and the build read it."""

    name: KindName
    task: str  # its task class, `module:Class` in `bucketing.kinds`
    title: str  # how a line names it: "a {title} model" (`a_model`)
    head: tuple[str, ...] | None = ("embedding",)  # its answer's leading fields; None: a classifier's, by labels
    detects: int = 0  # over 0: a folder is detected as this kind by its task's `detects` (higher: asked first)
    saved_as: str = ""  # the sentence-transformers class that saves such a folder
    note: str = ""  # what its answer is, when said in a line
    own_head: bool = False  # its task's `load_head` builds its head (a folder of it is refused as the default kind)
    engines: tuple[str, ...] | None = None  # the engines it serves on (the first is its default); None: all
    dtypes: tuple[str, ...] | None = None  # the dtypes it serves in; None: all
    refusal: str = ""  # the line for another engine or dtype: {model}, {engine}, {dtype}, {setting} (the flag or key)
    wire_refusal: str = ""  # the line from a wire format that does not answer it (`Wire.answers`): {model}, {wire}
    answer_bound: str = "texts"  # the start-up bound: per text; "one_text": one text must fit; "checked": per answer
    options: tuple[str, ...] = ()  # a request's options of its own
    files: tuple[
        str, ...
    ] = ()  # the files of its own its loader reads beside the transformer's (an archive keeps them)
    normalized: bool = True  # a request may normalise its answer or cut it to `dimensions`
    sparse: bool = False  # answers a vocabulary-size vector, as indices and values
    # the prompts every such model has, empty unless set (sentence-transformers' `_default_prompts`)
    role_prompts: tuple[str, ...] = ("query", "document")

    def __post_init__(self) -> None:
        """Its refusal lines name it as `a_model` does (`{model}` is filled in here; the rest when refused)."""
        for line in ("refusal", "wire_refusal"):
            object.__setattr__(self, line, getattr(self, line).replace("{model}", self.a_model))

    @property
    def a_model(self) -> str:
        """How a line names such a model, article included: "an embedding model", "a multi-vector model"."""
        return f"{'an' if self.title[:1].lower() in 'aeiou' else 'a'} {self.title} model"

    @property
    def classifier(self) -> bool:
        """A sequence classifier (its answer's fields are its labels'): logits scored, text pairs taken."""
        return self.head is None

    @property
    def per_token(self) -> bool:
        """Whether it answers one vector per kept token (its answer's `embeddings`)."""
        return self.head == ("embeddings",)

    @property
    def dense_vector(self) -> bool:
        """Whether it answers one dense vector per input (what an embeddings route carries)."""
        return self.head == ("embedding",) and not self.sparse

    def implementation(self) -> Implementation:
        """Its task class, imported now."""
        module, _, name = self.task.partition(":")
        loaded: ModuleType = importlib.import_module(f"bucketing.kinds.{module}")
        return cast("Implementation", getattr(loaded, name))

    def refused(self, engine: str, dtype: str, setting: str) -> str | None:
        """Why it is not served on this engine in this dtype (`setting`: the flag or key naming the dtype); None
        when it is."""
        if (self.engines is None or engine in self.engines) and (self.dtypes is None or dtype in self.dtypes):
            return None
        return self.refusal.format(engine=engine, dtype=dtype, setting=setting)


MODEL_KINDS: dict[str, Kind] = {  # by name (a str key: config and requests look names up)
    k.name: k
    for k in (
        Kind("embedding", "embedding:EmbeddingTask", "embedding"),
        Kind("classification", "classification:ClassificationTask", "classification", head=None, role_prompts=()),
        Kind(
            "sparse",
            "sparse.task:SparseTask",
            "sparse",
            detects=1,
            saved_as="SparseEncoder",
            note="one sparse vector per text",
            own_head=True,
            engines=SPARSE_ENGINES,  # the torch model, or an engine's exported graph (`EngineKind.sparse_graph`)
            dtypes=("float32",),
            refusal="{setting} {dtype}: {model} is served in float32 only (engine " + either(SPARSE_ENGINES) + ")",
            answer_bound="checked",
            options=("max_active_dims",),
            normalized=False,
            sparse=True,
        ),
        Kind(
            "multivector",
            "multivector.task:MultiVectorTask",
            "multi-vector",
            head=("embeddings",),
            detects=2,
            saved_as="MultiVectorEncoder",
            note="one vector per token",
            own_head=True,
            dtypes=("float32",),
            refusal="{setting} {dtype}: {model} is served in float32 only",
            wire_refusal="this is {model} (one vector per token), which {wire} cannot answer; served at "
            'POST /predictions/NAME (`{{"texts": [...], "input_type": "query" | "document"}}`) and .../embed_all (TEI)',
            answer_bound="one_text",
        ),
        Kind(
            "bgem3",
            "bgem3.task:BgeM3Task",
            "BGE-M3",
            detects=3,
            saved_as="FlagEmbedding BGE-M3",
            note="dense, sparse and ColBERT outputs of one pass",
            own_head=True,
            dtypes=("float32",),
            refusal="{setting} {dtype}: {model} is served in float32 only (as FlagEmbedding runs it on the CPU)",
            answer_bound="checked",
            options=("outputs", "sparse_tokens"),
            files=("sparse_linear.pt", "colbert_linear.pt"),  # its sparse and ColBERT heads
        ),
    )
}

# The kinds answered with one vector or score per input: what a wire format with no per-token answer declares.
ONE_PER_INPUT: tuple[KindName, ...] = tuple(k.name for k in MODEL_KINDS.values() if not k.per_token)


def detect(folder: Path | str) -> Kind:
    """The kind a folder is served as when none is given, as its own files say; else the default."""
    for kind in sorted((k for k in MODEL_KINDS.values() if k.detects), key=lambda k: -k.detects):
        if kind.implementation().detects(folder):
            return kind
    return MODEL_KINDS[DEFAULT]


def refused_folder(kind: Kind, folder: Path | str) -> Kind | None:
    """The kind with a head of its own that this folder is, when it is asked as the default kind; else None."""
    if kind.name != DEFAULT:
        return None
    return next((k for k in MODEL_KINDS.values() if k.own_head and k.implementation().detects(folder)), None)


def answer_fields(task: str, labels: int = 2) -> tuple[str, ...]:
    """The fields of an answer of this task (and number of labels), in order (what `Answer.fields` gives)."""
    head = MODEL_KINDS[task].head or (("score",) if labels == 1 else ("label", "scores"))
    return (*head, "tokens", "truncated")
