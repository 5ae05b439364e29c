"""What the pipeline reads of a task (`Task`), and the defaults of the hooks a model kind may override (`TaskHooks`):
a model kind (embedding, classification, sparse, multi-vector) is a task class; the pipeline never asks which."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from bucketing import chunks
from bucketing.answers import Answer, Options
from bucketing.model.chain import INPUT_TYPES, Chain
from bucketing.model.encoded import Encoded

if TYPE_CHECKING:
    from bucketing.model_kinds import Kind


@dataclass(frozen=True)
class Rows:
    """One padded sub-batch, as every task's forward takes it (built once per pass by `serving.passes.compute`)."""

    ids: np.ndarray  # [rows, padded length] token ids
    mask: np.ndarray  # the attention mask (a multi-vector query's unattended expansion is 0 here)
    skips: tuple[int, ...] = ()  # per row: leading (prompt) tokens left out of pooling; () when none
    types: np.ndarray | None = None  # token types of text pairs; None for single texts
    input_types: tuple[str | None, ...] = ()  # per row: its request's input_type (a routed task's route); ()
    pools: tuple[tuple[tuple[int, ...], ...], ...] = ()  # late chunking, per row: its spans' token positions; ()
    # per row: the sparse answer's cut its request asked (None: the model's), or False where the row is a window of
    # a text whose windows combine first (`on_overflow: chunk`): cut only the combined vector (read by sparse tasks)
    cuts: tuple[int | None | bool, ...] = ()
    outputs: tuple[tuple[str, ...], ...] = ()  # per row: the outputs its request renders (BGE-M3's); () when none

    @classmethod
    def plain(cls, rows: int, length: int, token: int) -> Rows:
        """`rows` rows of `length` copies of one token, all attended (to time a pass)."""
        return cls(np.full((rows, length), token, dtype=np.int64), np.ones((rows, length), dtype=np.int64))

    def pool_mask(self) -> np.ndarray | None:
        """The mask pooling reads: the attention mask with each row's skipped leading tokens zeroed; None when no
        row skips any (pooling reads the attention mask)."""
        if not any(self.skips):
            return None
        pool = self.mask.copy()
        for row, count in enumerate(self.skips):
            pool[row, :count] = 0
        return pool

    def take(self, rows: list[int], width: int | None = None) -> Rows:
        """These rows only, cut to `width` columns (all when None)."""
        cut = slice(None, width)
        return Rows(
            self.ids[rows, cut],
            self.mask[rows, cut],
            tuple(self.skips[r] for r in rows) if self.skips else (),
            self.types[rows, cut] if self.types is not None else None,
            tuple(self.input_types[r] for r in rows) if self.input_types else (),
            tuple(self.pools[r] for r in rows) if self.pools else (),
            outputs=tuple(self.outputs[r] for r in rows) if self.outputs else (),
        )


class Task(Protocol):
    """What the handler needs from a task: a forward pass per sub-batch, one answer per text, and its hooks."""

    name: str
    max_positions: int
    dimensions: int  # embedding size, number of labels, or vocabulary size (sparse)
    engine: Any  # its engine (engines.Engine for the dense kinds): the handler reads `fidelity`
    routed: bool  # forward takes each row's input_type (a sparse Router's route)
    tokenizer_dir: str | None  # where its tokenizer lives, if not the model folder (a sparse Router's MLM folder)
    ready_note: str  # said in the worker's ready line after the chain
    ranges: Any  # a dense model's fixed int8/uint8 [minimums, maximums] (`quantize.RANGES_FILE`); None: none
    chunk_refusal: str | None  # why `on_overflow: chunk` is not served (the rest of a line); None: it is
    late_refusal: str | None  # why late chunking is not served (the rest of a line); None: it is
    truncate_dim: int | None  # a dense model's own cut (sentence-transformers' truncate_dim); None: none

    @property
    def labels(self) -> tuple[str, ...] | None:
        """Class names (classification); None for embeddings."""
        ...

    @property
    def chain(self) -> Chain | None:
        """The sentence-transformers module chain the engine runs after the encoder (pooling, Dense); None when none
        follows it (a classifier)."""
        ...

    @property
    def settings(self) -> Chain:
        """The folder's sentence-transformers settings a request reads: its prompts (for embeddings, its chain)."""
        ...

    def forward(self, rows: Rows) -> Sequence[np.ndarray]:
        """The task's output for each row of a padded sub-batch."""
        ...

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer: ...

    def input_lengths(self) -> dict[str, int]:
        """The model's own token limits per input type (checked against its limit at start); none by default."""
        ...

    def cut(self, input_type: str | None, ceiling: int) -> int:
        """Where a text of this input type is cut: within `ceiling` (max_length), or past it for an input type that
        runs no transformer (a sparse Router's static route, cut where its own tokenizer cuts)."""
        ...

    def planned(self, encoded: Encoded) -> int:
        """The tokens a row is planned and costed as: its length, or fewer for a row no transformer runs (the
        pass is collated as wide as its longest row, whatever the plan)."""
        ...

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        """A text's tokens as its input type gives them (a multi-vector query: cut, then expanded)."""
        ...

    def refuse(self, encoded: Encoded, where: str, max_length: int) -> str | None:
        """Why this tokenized text is not served exactly (a 413 line); None when it is."""
        ...

    def numbers(self, encoded: Encoded, options: Options) -> int | None:
        """The fewest numbers its answer will have, known from its tokens before any pass (a request over the
        response cap refused before it runs); None: bounded per text at start instead."""
        ...

    def combine(self, vectors: Sequence[Any], weights: Sequence[int], input_type: str | None) -> Any:
        """`on_overflow: chunk`: one text's vector from its windows' outputs (`weights`: its tokens in each; each an
        array, or what the task's `forward` makes of a row: a sparse model's `SparseRow`)."""
        ...


class TaskHooks:
    """The hooks' defaults: one route, the model folder's tokenizer, every input type cut at max_length as
    tokenized, every text served."""

    routed = False
    tokenizer_dir: str | None = None
    ready_note = ""
    ranges: Any = None
    chunk_refusal: str | None = "is for embedding models (one vector per text, pooled over windows)"
    late_refusal: str | None = "is for embedding models (one vector per span, pooled over its tokens)"
    truncate_dim: int | None = None

    def input_lengths(self) -> dict[str, int]:
        return {}

    @staticmethod
    def detects(folder: Path | str) -> bool:
        """Whether a folder is of this kind by its own files (`model_kinds.detect` asks the kinds that detect)."""
        return False

    @staticmethod
    def encoder_folder(folder: Path) -> tuple[Path, int | None, str] | None:
        """Where its transformer lives when not in the folder itself (checked at build as an embedding model), the
        tokens its chain cuts texts at, and the transformers class it is loaded as; None: the folder itself."""
        return None

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        """What the build records of its chain in the model-config (for a person reading it); None: nothing."""
        return None

    @staticmethod
    def engine_refusal(folder: Path, engine: str) -> str | None:
        """Why this folder is not served on `engine` (one line, said at build as at worker start); None: it is."""
        return None

    def cut(self, input_type: str | None, ceiling: int) -> int:
        return ceiling

    def planned(self, encoded: Encoded) -> int:
        return len(encoded.ids)

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        return encoded

    def refuse(self, encoded: Encoded, where: str, max_length: int) -> str | None:
        return None

    def numbers(self, encoded: Encoded, options: Options) -> int | None:
        return None

    def combine(self, vectors: Sequence[Any], weights: Sequence[int], input_type: str | None) -> Any:
        return chunks.pool(vectors, weights)


class Loads(Protocol):
    """A kind's task class as a worker opens it: its `load` (the task on the configured engine)."""

    def load(self, config: Any, model_dir: str, gpu_id: Any = None) -> Task: ...


def load_kind(kind: Kind, config: Any, model_dir: str, gpu_id: Any = None) -> Task:
    """The kind's task on the configured engine: its task class's `load` (the class imported now)."""
    return cast("Loads", kind.implementation()).load(config, model_dir, gpu_id)


def reach(task: Task, max_length: int) -> int:
    """The tokens texts are tokenized to: max_length, or further where the task cuts an input type further (a sparse
    Router's static route); its `shape` then cuts each text back to where its own input type is cut."""
    return max(task.cut(input_type, max_length) for input_type in (None, *INPUT_TYPES))
