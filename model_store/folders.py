"""A model folder checked at build, before anything is staged: whether the handler can serve it for a task (its
config.json, architecture, weights' shapes, tokenizer; a chain's Transformer in its own folder, a T5's encoder alone),
the task it is detected as, its sentence-transformers settings, and where sentence-transformers cuts its texts.
`archives` re-exports these (its importers read them there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bucketing.config import TASKS
from bucketing.engine_registry import DEFAULT_ENGINE, EXACT_DTYPE, is_reduced
from bucketing.model_kinds import DEFAULT, MODEL_KINDS, detect


class ModelFolderError(ValueError):
    """A model folder the handler cannot serve; the message names what is missing."""


def check_model_dir(
    model_dir: Path, task: str, dtype: str | None = None, chained: bool = True, loaded_as: str | None = None
) -> int:
    """Whether the handler can serve this folder (config.json, a known architecture for the task, weights of the
    shapes config.json declares, a fast tokenizer, weights saved in float32 unless `dtype` (handler.dtype) is
    reduced); returns the tokens per text sentence-transformers cuts it at (`sentence_transformers_limit`). Raises
    ModelFolderError naming what is missing. `chained` False: the transformer of a chain its kind has read (its
    folder may be the chain's own), loaded as the transformers class `loaded_as`."""
    if task not in TASKS:
        raise ModelFolderError(f"--task {task!r}; allowed: {', '.join(TASKS)}")
    kind = MODEL_KINDS[task]
    refusal = kind.refused(DEFAULT_ENGINE, dtype or EXACT_DTYPE, "--dtype")
    if refusal is not None:
        raise ModelFolderError(refusal)
    from bucketing.model.chain import ChainError

    try:
        encoder = kind.implementation().encoder_folder(model_dir)
    except ChainError as e:
        raise ModelFolderError(str(e)) from None
    if encoder is not None:  # its transformer in a folder of its own (a sparse model's MLM): checked as a model
        longest = check_model_dir(encoder[0], DEFAULT, dtype, chained=False, loaded_as=encoder[2])
        return min(longest, encoder[1] or longest)
    classifier = MODEL_KINDS[task].classifier
    # The chain first: a module it cannot serve (a dense Router) is its own line, whatever else the folder lacks.
    chain = read_model_chain(model_dir, task) if not classifier and chained else None
    body = model_dir  # where the transformer and its tokenizer live: for a dense chain, its Transformer's folder
    dense = chain is not None and not kind.own_head  # what `head.load_head` loads (a kind's own head: as it does)
    if dense:
        from bucketing.model.chain import transformer_folder

        try:
            body = transformer_folder(model_dir)  # `0_Transformer/` in an older layout
        except ChainError as e:
            raise ModelFolderError(str(e)) from None
    if not (body / "config.json").is_file():
        raise ModelFolderError(f"{body}: no config.json (a Hugging Face model folder, as save_pretrained writes)")
    import transformers
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(body)
    except Exception as e:  # noqa: BLE001 - reported in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ModelFolderError(f"{body}: config.json is not a model config transformers knows ({first})") from e
    from bucketing.model.head import EngineError, encoder_only

    try:  # an encoder-decoder sentence-transformers loads the encoder of alone (T5): that class, or refused
        alone = encoder_only(config) if dense else None
    except EngineError as e:
        raise ModelFolderError(f"{body}: {e}") from None
    auto = getattr(
        transformers, alone or loaded_as or ("AutoModelForSequenceClassification" if classifier else "AutoModel")
    )
    if alone is None and type(config) not in auto._model_mapping:  # noqa: SLF001 - what from_pretrained consults
        raise ModelFolderError(f"{body}: architecture {config.model_type!r} has no {auto.__name__} class")
    from bucketing.model.weights import check_weight_shapes

    try:  # before anything of the sizes config.json declares is allocated (the worker checks it again)
        check_weight_shapes(auto, body)
    except ChainError as e:
        raise ModelFolderError(str(e)) from None
    from bucketing.model.head import REDUCED_SAVED, reduced_weights, saved_dtype

    if not is_reduced(dtype) and saved_dtype(config) in REDUCED_SAVED:
        raise ModelFolderError(reduced_weights(body, saved_dtype(config)))
    if classifier:
        from bucketing.model.head import activation, class_labels

        try:
            class_labels(config)
            activation(config, model_dir)
        except (ValueError, EngineError) as e:
            raise ModelFolderError(f"{model_dir}: {e}") from None
    from bucketing.model.tokenizer import Tokenizer

    try:
        tokenizer = Tokenizer(str(body), 8)
    except Exception as e:  # noqa: BLE001 - reported in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelFolderError(f"no usable fast tokenizer: {first}") from e
    from bucketing.model.chain import sentence_transformers_limit
    from bucketing.model.head import usable_positions

    try:
        positions = usable_positions(config)
    except (TypeError, ValueError) as e:
        raise ModelFolderError(f"{model_dir}: config.json max_position_embeddings is not a number ({e})") from None
    max_seq_length = chain.max_seq_length if chain is not None else None
    return sentence_transformers_limit(max_seq_length, tokenizer.model_max_length, positions)


def hidden_size(model_dir: Path) -> int | None:
    """The width of the folder's transformer as transformers reads its config.json (`hidden_size`, T5's `d_model`),
    from its Transformer's own folder (`0_Transformer/` in an older layout); None where it cannot be read."""
    from transformers import AutoConfig

    from bucketing.model.chain import ChainError, transformer_folder

    try:
        size = AutoConfig.from_pretrained(transformer_folder(model_dir)).hidden_size
    except (ChainError, OSError, ValueError, AttributeError, KeyError):
        return None
    return size if isinstance(size, int) else None


def detect_task(model_dir: Path) -> str:
    """The task a folder is served as when --task is not given, as its own files name it (the kinds that detect,
    in kinds.py: `multivector` for what MultiVectorEncoder saved, `sparse` for what SparseEncoder loads), else
    embedding."""
    return detect(model_dir).name


def read_model_chain(model_dir: Path, task: str = "embedding") -> Any:
    """The folder's sentence-transformers settings as its kind reads them (`bucketing.model.chain.Chain`; a
    classifier's: a CrossEncoder's prompts alone, as its worker reads them), or ModelFolderError in one line."""
    from bucketing.model.chain import ChainError

    try:
        return MODEL_KINDS[task].implementation().read_settings(model_dir)
    except ChainError as e:
        raise ModelFolderError(str(e)) from None
