"""What the pipeline reads of a task (`Task`), and the defaults of the hooks a model kind may override (`TaskHooks`):
a model kind (embedding, classification, sparse, multi-vector) is a task class; the pipeline never asks which."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .answers import Answer, Options
from .chain import Chain
from .tokenizer import Encoded


class Task(Protocol):
    """What the handler needs from a task: a forward pass per sub-batch, one answer per text, and its hooks."""

    name: str
    max_positions: int
    dimensions: int  # embedding size, number of labels, or vocabulary size (sparse)
    engine: Any  # its engine (engines.Engine for the dense kinds): the handler reads `fidelity`
    routed: bool  # forward takes each row's input_type (a sparse Router's route)
    tokenizer_dir: str | None  # where its tokenizer lives, if not the model folder (a sparse Router's MLM folder)
    ready_note: str  # said in the worker's ready line after the chain

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

    def forward(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        skip: Sequence[int] | None = None,
        types: np.ndarray | None = None,
        input_types: Sequence[str | None] | None = None,
    ) -> np.ndarray: ...

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer: ...

    def input_lengths(self) -> dict[str, int]:
        """The model's own token limits per input type (checked against its limit at start); none by default."""
        ...

    def cut(self, input_type: str | None, ceiling: int) -> int:
        """Where a text of this input type is cut, within `ceiling` (max_length)."""
        ...

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        """A text's tokens as its input type gives them (a multi-vector query: cut, then expanded)."""
        ...

    def refuse(self, encoded: Encoded, where: str, max_length: int) -> str | None:
        """Why this tokenized text is not served exactly (a 413 line); None when it is."""
        ...


class TaskHooks:
    """The hooks' defaults: one route, the model folder's tokenizer, every input type cut at max_length as
    tokenized, every text served."""

    routed = False
    tokenizer_dir: str | None = None
    ready_note = ""

    def input_lengths(self) -> dict[str, int]:
        return {}

    @staticmethod
    def detects(folder: Path | str) -> bool:
        """Whether a folder is of this kind by its own files (kinds.detect asks the kinds that detect)."""
        return False

    @staticmethod
    def encoder_folder(folder: Path) -> tuple[Path, int | None] | None:
        """Where its transformer lives when not in the folder itself (checked at build as an embedding model), and
        the tokens its chain cuts texts at; None: the folder itself."""
        return None

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        """What the build records of its chain in the model-config (for a person reading it); None: nothing."""
        return None

    def cut(self, input_type: str | None, ceiling: int) -> int:
        return ceiling

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        return encoded

    def refuse(self, encoded: Encoded, where: str, max_length: int) -> str | None:
        return None
