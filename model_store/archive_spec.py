"""What to build, checked: `ArchiveSpec` (the model folder's checks and each archive's model-config), the
fidelity a reduced dtype measures at build, and `BuildError`, the one line an archive that cannot be built gets.
`model_store.build` runs them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketing.config import MAX_LENGTH_CAP
from bucketing.config import STRATEGIES as STRATEGIES  # re-exported: the bench builds these by default
from bucketing.engine_registry import DEFAULT_ENGINE, DTYPE_KINDS, ENGINES, EXACT_DTYPE, is_reduced
from bucketing.model_kinds import MODEL_KINDS
from bucketing.quantize import RANGES_FILE
from model_store import archives


def parse_prompts(values: list[str]) -> dict[str, str]:
    """`--prompt NAME=TEXT` values as a mapping (TEXT may hold `=` and end in a space, as "query: " does)."""
    prompts = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise archives.ModelFolderError(f"--prompt {value!r}: expected NAME=TEXT, e.g. query='query: '")
        prompts[name.strip()] = text
    return prompts


class BuildError(RuntimeError):
    """An archive that cannot be built: the message says why, in one line."""


@dataclass(frozen=True)
class Calibration:
    """Texts the archive's int8/uint8 ranges are computed from, and where they come from (said in the build line)."""

    texts: list[str]
    source: str
    max_length: int | None = None  # tokens a text is cut at, as the archive serves it (None: the model's own)


@dataclass(frozen=True)
class ArchiveSpec:
    """What to build: one archive per strategy, from the template with these settings (None: the template's)."""

    strategies: Sequence[str] = STRATEGIES
    threads: int = 1
    response_timeout: int | None = None  # TorchServe's responseTimeout, s (None: the template's)
    engine: str | None = None
    model_dir: Path | None = None  # None: the bundled MiniLM
    task: str | None = None  # with model_dir: embedding | classification
    prefix: str = archives.PREFIX
    schedule: str | None = None
    prompts: Mapping[str, str] | None = None
    default_prompt: str | None = None
    max_length: int | None = None  # None: the model's own limit (the bundled MiniLM: the template's)
    dtype: str | None = None  # other than float32: engine torch, its fidelity measured and printed at build
    calibration_texts: Path | None = None  # a file of texts, one a line: the archive's int8/uint8 ranges from them
    calibrate: bool = True  # without calibration_texts, a dense model's ranges from the bench's long-tail texts
    truncate_dim: int | None = None  # handler.truncate_dim: every answer cut to its first N components
    settings: Mapping[str, Any] | None = None  # other `handler:` keys set in every archive (checked by the worker)

    @property
    def folder(self) -> Path:
        return self.model_dir or archives.minilm_dir()

    def calibration(self, task: str, max_length: int | None = None) -> Calibration | None:
        """The calibration texts and how the build line names them: the file's non-blank lines; without a file, for
        a dense embedding model without ranges of its own (`RANGES_FILE`, which then win), the bench's long-tail
        texts (`ranges.default_texts`); none with `calibrate` off."""
        if not self.calibrate:
            return None
        if self.calibration_texts is None:
            if not MODEL_KINDS[task].dense_vector or (self.folder / RANGES_FILE).is_file():  # a folder's own win
                return None
            from model_store.ranges import default_texts

            return Calibration(*default_texts(), max_length)
        try:
            lines = self.calibration_texts.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise BuildError(f"--calibration-texts {self.calibration_texts}: {e}") from None
        texts = [line for line in lines if line.strip()]
        return Calibration(texts, f"--calibration-texts {self.calibration_texts}", max_length)

    def checked_truncate_dim(self, task: str, chain: Any) -> int:
        """`truncate_dim` as the worker will take it: a dense embedding model's, 1 to its embedding size."""
        if not MODEL_KINDS[task].dense_vector:
            raise BuildError(f"--truncate-dim cuts dense embeddings (task embedding); this is task {task}")
        hidden = archives.hidden_size(self.folder)  # its Transformer's config.json (T5: d_model)
        size = chain.dimensions(hidden) if hidden is not None else None
        value = self.truncate_dim
        if value is None or not 1 <= value <= (size or value):
            raise BuildError(f"--truncate-dim {value}: allowed 1 to {size}, the model's embedding size")
        return value

    def length(self, longest: int) -> int:
        """The archive's max_length for a model sentence-transformers cuts at `longest` tokens: that, or the
        explicit `max_length` below it (printed: longer texts then differ); past MAX_LENGTH_CAP, a BuildError."""
        from bucketing.model.head import UNBOUNDED_POSITIONS

        if self.max_length is None and longest >= UNBOUNDED_POSITIONS:
            raise BuildError(
                f"{self.folder}: sentence-transformers cuts none of its texts (relative positions, and neither a "
                "max_seq_length nor its tokenizer's model_max_length says a limit); pass --max-length N (at most "
                f"{MAX_LENGTH_CAP}), and texts over N tokens will differ from sentence-transformers"
            )
        if self.max_length is None:
            if longest > MAX_LENGTH_CAP:
                raise BuildError(
                    f"{self.folder}: the model takes {longest} tokens a text, above the handler's cap of "
                    f"{MAX_LENGTH_CAP} (memory per pass); pass --max-length N (at most {MAX_LENGTH_CAP}), and texts "
                    "over N tokens will differ from sentence-transformers"
                )
            return longest
        own = "none" if longest >= UNBOUNDED_POSITIONS else f"{longest} tokens"  # a relative-position model's
        if not 1 <= self.max_length <= min(longest, MAX_LENGTH_CAP):
            raise BuildError(
                f"--max-length {self.max_length}: allowed 1 to {min(longest, MAX_LENGTH_CAP)} (the model's own "
                f"limit is {own}, where sentence-transformers cuts its texts)"
            )
        if self.max_length < longest:
            print(
                f"note: max_length {self.max_length} (--max-length) is below the model's own limit of {own}: "
                f"texts over {self.max_length} tokens will differ from sentence-transformers' answers"
            )
        return self.max_length

    def configs(self) -> dict[str, dict[str, Any]]:
        """Each archive's name and model-config: the template with the strategy, threads, engine, schedule,
        prompts, and for a user's folder its task and max_length: where sentence-transformers cuts its texts, or
        `max_length` below that (said in the build output). BuildError for a folder we cannot serve."""
        unknown = sorted(set(self.strategies) - set(STRATEGIES))
        if unknown:
            raise BuildError(f"--strategies: unknown {', '.join(unknown)}; allowed: {', '.join(STRATEGIES)}")
        task = self.task or (archives.detect_task(self.folder) if self.model_dir is not None else "embedding")
        kind = MODEL_KINDS[task]
        reduced = is_reduced(self.dtype)
        engine = self.engine or (
            kind.engines[0] if kind.engines else DEFAULT_ENGINE if reduced else archives.default_engine()
        )
        refusal = kind.refused(engine, self.dtype or EXACT_DTYPE, "--dtype")
        if refusal is not None:
            raise BuildError(refusal)
        if reduced and self.engine is not None and self.dtype not in engine_dtypes(self.engine):
            allowed = " or ".join(e for e in ENGINES if self.dtype in engine_dtypes(e))
            raise BuildError(f"--dtype {self.dtype} runs on engine {allowed}; got --engine {self.engine}")
        overrides: dict[str, Any] = {"engine": engine, "schedule": self.schedule, "dtype": self.dtype}
        try:
            if self.model_dir is not None or self.max_length is not None:
                longest = archives.check_model_dir(self.folder, task, self.dtype)
                overrides.update(task=task if self.model_dir is not None else None, max_length=self.length(longest))
            chain = archives.read_model_chain(self.folder, task)
            refusal = kind.implementation().engine_refusal(self.folder, engine) if self.model_dir else None
            if refusal is not None:
                raise BuildError(f"--engine {engine}: {refusal}")
            known = {**dict(chain.prompts), **(self.prompts or {})}
            if self.default_prompt is not None and self.default_prompt not in known:
                raise archives.ModelFolderError(
                    f"--default-prompt {self.default_prompt!r}: not a prompt of the model or "
                    f"of --prompt ({', '.join(known) or 'none'})"
                )
            if self.truncate_dim is not None:
                overrides["truncate_dim"] = self.checked_truncate_dim(task, chain)
        except archives.ModelFolderError as e:
            raise BuildError(str(e)) from None
        overrides.update(prompts=dict(self.prompts) if self.prompts else None, default_prompt_name=self.default_prompt)
        overrides.update(self.settings or {})
        configs = {
            archives.name(s, self.threads, self.prefix): archives.model_config(s, self.threads, **overrides)
            for s in self.strategies
        }
        if self.response_timeout is not None:
            for cfg in configs.values():
                cfg["responseTimeout"] = self.response_timeout
        described = kind.implementation().describe(self.folder)
        if described is not None:  # what was read, for a person reading the model-config (the worker reads the folder)
            for cfg in configs.values():
                cfg["model_chain"] = described
        return configs


def report_fidelity(configs: Mapping[str, dict[str, Any]], model_dir: Path) -> None:
    """For archives of a reduced dtype: measure and print its fidelity to float32 on the probe set, as the worker
    will at start (a BuildError where the worker would refuse it: below its handler.min_cosine)."""
    from bucketing.config import HandlerConfig

    handler = HandlerConfig.from_mapping(next(iter(configs.values()))["handler"])
    if not is_reduced(handler.dtype):
        return
    import dataclasses

    import torch

    from bucketing.engines import precision
    from bucketing.engines.torch_engine import DTYPES as TORCH_DTYPES
    from bucketing.model.head import EngineError, load_head

    if handler.dtype not in engine_dtypes(handler.engine):
        raise BuildError(f"handler.dtype {handler.dtype} does not run on engine {handler.engine}")
    measured = dataclasses.replace(handler, min_cosine=0.0, torchscript=False, fidelity_sample=0.0)
    try:
        head, info = load_head(handler.task, str(model_dir))
        with torch.inference_mode():
            engine = ENGINES[handler.engine].open(
                head, info, measured, str(model_dir), "cpu", TORCH_DTYPES[handler.dtype]
            )
    except (EngineError, OSError, ValueError) as e:
        raise BuildError(f"--dtype {handler.dtype}: fidelity not measured ({str(e).splitlines()[0][:300]})") from None
    fidelity = getattr(engine, "fidelity", None)
    if fidelity is None:
        raise BuildError(f"--dtype {handler.dtype}: fidelity not measured")
    native = precision.native_bf16(precision.cpu_info())
    if DTYPE_KINDS[handler.dtype].cpu_flags is None:  # float16: no CPU worker serves it
        where = f"on this CPU; {handler.dtype} is served on a CUDA GPU only"
    else:
        where = f"this CPU multiplies bfloat16 natively ({native})" if native else "this CPU emulates bfloat16"
    print(f"{fidelity.describe()} (measured at build; {where})")
    refusal = fidelity.refusal(handler.min_cosine)
    if refusal:
        raise BuildError(f"{refusal} (a worker would not start)")


def engine_dtypes(engine: str) -> tuple[str, ...]:
    """The dtypes an engine runs (`EngineKind.dtypes`)."""
    return ENGINES[engine].dtypes
