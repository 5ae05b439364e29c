"""Build TorchServe archives, one per padding strategy: `python -m model_store.build [--if-stale]`.

Each archive holds the handler module and the `bucketing` package copied from the installed sources, the model
files (under `model/`; all-MiniLM-L6-v2 from its package by default), and its model-config: the template
`config/minilm.yaml` with `handler.strategy` set (and `handler.torch_threads` for `--threads N` variants, named
`minilm-tN-<strategy>`). With `--config FILE --name NAME`, one archive NAME.mar from that model-config instead
(a tuned configuration, as `bench/compare.py --suite tune` writes it).

`--print-commands` stages the archive's files into `--stage-dir` (the `bucketing/` package, the model folder, the
exported ONNX graph for the onnxruntime engine), writes each archive's model-config beside them, and prints the
exact `torch-model-archiver` command line the build would run for each, building nothing: TorchServe's own
archiver, run by hand or in a user's own build, then makes the same archives.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bucketing.config import DTYPES, ENGINES, MAX_LENGTH_CAP, SCHEDULES, TASKS
from bucketing.config import STRATEGIES as STRATEGIES  # re-exported: the bench builds these by default
from bucketing.kinds import KINDS
from model_store import archives


def stage(staging: Path, model_dir: Path, engine: str, task: str) -> Path:
    """Lay out the archive's extra files: `bucketing/` (from the installed sources) and `model/` (the folder's
    files and the folders of its sentence-transformers chain; for onnxruntime, with the exported graph)."""
    if staging.exists():
        shutil.rmtree(staging)
    _, package = archives.handler_sources()
    shutil.copytree(package, staging / "bucketing", ignore=shutil.ignore_patterns("__pycache__"))
    (staging / "model").mkdir(parents=True)
    for relative, source in archives.archived_files(model_dir):  # each checked to lie inside the model folder
        target = staging / "model" / relative
        if not target.resolve().is_relative_to(staging.resolve()):
            raise BuildError(f"{relative}: would be written outside the staging folder {staging}; refused")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    from bucketing.engines import ENGINE_KINDS
    from bucketing.head import EngineError

    try:
        ENGINE_KINDS[engine].prepare_into(task, str(model_dir), staging / "model")
    except EngineError as e:
        raise BuildError(str(e)) from None
    return staging


def archiver_command(
    name: str, config: Path, staging: Path, out: Path, archiver: str = "torch-model-archiver"
) -> list[str]:
    """The torch-model-archiver command line of one archive: the handler module, the staged extra files, the
    model-config, uncompressed (`zip-store`: the model is already compressed, and TorchServe unpacks it faster)."""
    module, _ = archives.handler_sources()
    return [
        archiver,
        "--model-name",
        name,
        "--version",
        "1.0",
        "--handler",
        str(module),
        "--extra-files",
        str(staging),
        "--config-file",
        str(config),
        "--export-path",
        str(out),
        "--archive-format",
        "zip-store",
        "--force",
    ]


def build(name: str, config: Path, staging: Path, out: Path, archiver: str, tmp: Path) -> Path:
    # The archiver stages its files under the temp folder: keep that inside a folder of ours.
    cmd = archiver_command(name, config, staging, out, archiver)
    subprocess.run(cmd, check=True, env={**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp)})
    return out / f"{name}.mar"


def shown(path: Path) -> str:
    """A path as a user types it here: relative to the working directory when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def print_commands(
    configs: dict[str, dict[str, Any]], model_dir: Path, engine: str, task: str, out: Path, stage_dir: Path
) -> int:
    """Stage the files and model-configs into `stage_dir` and print the archiver command of each archive."""
    report_fidelity(configs, model_dir)
    staging = stage(stage_dir / "extra", model_dir, engine, task)
    from bucketing.engines import ENGINE_KINDS

    written = ENGINE_KINDS[engine].files
    note = f"; {', '.join(written)} written for the {engine} engine" if written else ""
    model_files = sorted(p.name for p in (staging / "model").iterdir() if p.name not in written)
    _, package = archives.handler_sources()
    print(
        f"# staged {shown(staging)}/: bucketing/ (the handler package, from {shown(package)}), model/ "
        f"({len(model_files)} files from {shown(model_dir)}"
        f"{note})"
    )
    for name, cfg in configs.items():
        config = stage_dir / f"{name}.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        print(
            f"# {name}: model-config {shown(config)} (handler.strategy {cfg['handler'].get('strategy')}, "
            f"engine {cfg['handler'].get('engine')}, batchSize {cfg.get('batchSize')})"
        )
        cmd = archiver_command(name, Path(shown(config)), Path(shown(staging)), Path(shown(out)))
        cmd[cmd.index("--handler") + 1] = shown(Path(cmd[cmd.index("--handler") + 1]))
        print(" ".join(shlex.quote(part) for part in cmd))
    return 0


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
class ArchiveSpec:
    """What to build: one archive per strategy, from the template with these settings (None: the template's)."""

    strategies: Sequence[str] = STRATEGIES
    threads: int = 1
    engine: str | None = None
    model_dir: Path | None = None  # None: the bundled MiniLM
    task: str | None = None  # with model_dir: embedding | classification
    prefix: str = archives.PREFIX
    schedule: str | None = None
    prompts: Mapping[str, str] | None = None
    default_prompt: str | None = None
    max_length: int | None = None  # None: the model's own limit (the bundled MiniLM: the template's)
    dtype: str | None = None  # other than float32: engine torch, its fidelity measured and printed at build

    @property
    def folder(self) -> Path:
        return self.model_dir or archives.minilm_dir()

    def length(self, longest: int) -> int:
        """The archive's max_length for a model sentence-transformers cuts at `longest` tokens: that, or the
        explicit `max_length` below it (printed: longer texts then differ); past MAX_LENGTH_CAP, a BuildError."""
        if self.max_length is None:
            if longest > MAX_LENGTH_CAP:
                raise BuildError(
                    f"{self.folder}: the model takes {longest} tokens a text, above the handler's cap of "
                    f"{MAX_LENGTH_CAP} (memory per pass); pass --max-length N (at most {MAX_LENGTH_CAP}), and texts "
                    "over N tokens will differ from sentence-transformers"
                )
            return longest
        if not 1 <= self.max_length <= min(longest, MAX_LENGTH_CAP):
            raise BuildError(
                f"--max-length {self.max_length}: allowed 1 to {min(longest, MAX_LENGTH_CAP)} (the model's own "
                f"limit is {longest} tokens, where sentence-transformers cuts its texts)"
            )
        if self.max_length < longest:
            print(
                f"note: max_length {self.max_length} (--max-length) is below the model's own limit of {longest} "
                f"tokens: texts over {self.max_length} tokens will differ from sentence-transformers' answers"
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
        kind = KINDS[task]
        reduced = self.dtype not in (None, "float32")
        engine = self.engine or (kind.engines[0] if kind.engines else "torch" if reduced else archives.default_engine())
        refusal = kind.refused(engine, self.dtype or "float32", "--dtype")
        if refusal is not None:
            raise BuildError(refusal)
        if reduced and self.engine not in (None, "torch"):
            raise BuildError(f"--dtype {self.dtype} runs on the torch engine; got --engine {self.engine}")
        overrides: dict[str, Any] = {"engine": engine, "schedule": self.schedule, "dtype": self.dtype}
        try:
            if self.model_dir is not None or self.max_length is not None:
                longest = archives.check_model_dir(self.folder, task, self.dtype)
                overrides.update(task=task if self.model_dir is not None else None, max_length=self.length(longest))
            chain = archives.read_model_chain(self.folder, task)
            known = {**dict(chain.prompts), **(self.prompts or {})}
            if self.default_prompt is not None and self.default_prompt not in known:
                raise archives.ModelFolderError(
                    f"--default-prompt {self.default_prompt!r}: not a prompt of the model or "
                    f"of --prompt ({', '.join(known) or 'none'})"
                )
        except archives.ModelFolderError as e:
            raise BuildError(str(e)) from None
        overrides.update(prompts=dict(self.prompts) if self.prompts else None, default_prompt_name=self.default_prompt)
        configs = {
            archives.name(s, self.threads, self.prefix): archives.model_config(s, self.threads, **overrides)
            for s in self.strategies
        }
        described = kind.implementation().describe(self.folder)
        if described is not None:  # what was read, for a person reading the model-config (the worker reads the folder)
            for cfg in configs.values():
                cfg["model_chain"] = described
        return configs


def build_archives(out: Path, spec: ArchiveSpec, if_stale: bool = False) -> list[Path]:
    """Build the spec's archives (with `if_stale`, only those missing or older than a source); their paths."""
    configs = spec.configs()
    if if_stale:
        configs = {n: cfg for n, cfg in configs.items() if archives.stale(out / f"{n}.mar")}
        if not configs:
            print("archives are up to date")
            return []
    handler = next(iter(configs.values()))["handler"]
    return build_all(configs, spec.folder, handler["engine"], handler.get("task", "embedding"), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=archives.STORE, help="where the .mar files go")
    parser.add_argument("--model-dir", type=Path, default=None, help="model files (default: the installed package)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker (names minilm-tN-*)")
    parser.add_argument("--engine", choices=ENGINES, help="torch or onnxruntime (default: the template's)")
    parser.add_argument("--schedule", choices=SCHEDULES, help="handler.schedule (default: the template's)")
    parser.add_argument("--name", default=archives.PREFIX, help="archive name prefix: NAME-<strategy>.mar")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help="with --model-dir: embedding, classification or sparse (default: sparse for a SparseEncoder folder, "
        "else embedding)",
    )
    parser.add_argument("--if-stale", action="store_true", help="only archives missing or older than a source")
    parser.add_argument("--config", type=Path, help="one archive, NAME.mar, from this model-config YAML")
    parser.add_argument(
        "--print-commands",
        action="store_true",
        help="stage into --stage-dir and print the torch-model-archiver commands; build nothing",
    )
    parser.add_argument(
        "--stage-dir",
        type=Path,
        default=Path(".tmp") / "stage",
        help="with --print-commands: where the archive's files and model-configs are laid out",
    )
    parser.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="a prompt requests may name (repeatable): e5's query='query: ', bge's query instruction",
    )
    parser.add_argument("--default-prompt", metavar="NAME", help="the prompt used when a request names none")
    parser.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="tokens per text, below the model's own limit (default: that limit, as sentence-transformers cuts; "
        "longer texts then differ from it)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="handler.dtype; bfloat16 (engine torch; served where the CPU multiplies it natively) prints its "
        "fidelity to float32, measured on sample texts here",
    )
    args = parser.parse_args(argv)
    try:
        if args.config is not None:
            from_config(args.config, args.name, args.out, args.model_dir)
            return 0
        spec = ArchiveSpec(
            strategies=[s.strip() for s in args.strategies.split(",") if s.strip()],
            threads=args.threads,
            engine=args.engine,
            model_dir=args.model_dir,
            task=args.task if args.model_dir is not None else None,
            prefix=args.name,
            schedule=args.schedule,
            prompts=parse_prompts(args.prompt),
            default_prompt=args.default_prompt,
            max_length=args.max_length,
            dtype=args.dtype,
        )
        if args.print_commands:
            configs = spec.configs()
            handler = next(iter(configs.values()))["handler"]  # the task as given or detected
            args.stage_dir.mkdir(parents=True, exist_ok=True)
            return print_commands(
                configs, spec.folder, handler["engine"], handler.get("task", "embedding"), args.out, args.stage_dir
            )
        build_archives(args.out, spec, args.if_stale)
    except (BuildError, archives.ModelFolderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def build_all(configs: dict[str, dict[str, Any]], model_dir: Path, engine: str, task: str, out: Path) -> list[Path]:
    """One archive per (name, model-config), sharing one staged model folder; their paths."""
    archiver = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent)) or shutil.which(
        "torch-model-archiver"
    )
    if not archiver:
        raise BuildError("torch-model-archiver not found: run `make venv` first")
    report_fidelity(configs, model_dir)
    tmp = archives.ROOT / ".tmp"
    tmp.mkdir(exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    staging = stage(tmp / "staging", model_dir, engine, task)
    built = []
    with tempfile.TemporaryDirectory(dir=tmp) as folder:
        for name, cfg in configs.items():
            start = time.perf_counter()
            config = Path(folder) / f"{name}.yaml"
            config.write_text(yaml.safe_dump(cfg, sort_keys=False))
            try:
                path = build(name, config, staging, out, archiver, tmp)
            except subprocess.CalledProcessError as e:
                raise BuildError(f"torch-model-archiver failed for {name} (exit {e.returncode}; see above)") from None
            built.append(path)
            shown = path.relative_to(archives.ROOT) if path.is_relative_to(archives.ROOT) else path
            print(f"built {shown} ({path.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - start:.1f} s)")
    shutil.rmtree(staging, ignore_errors=True)
    return built


def report_fidelity(configs: Mapping[str, dict[str, Any]], model_dir: Path) -> None:
    """For archives of a reduced dtype: measure and print its fidelity to float32 on the sample texts, as the worker
    will at start (a BuildError where the worker would refuse it: below its handler.min_cosine)."""
    from bucketing.config import HandlerConfig

    handler = HandlerConfig.from_mapping(next(iter(configs.values()))["handler"])
    if handler.dtype == "float32":
        return
    import dataclasses

    import torch

    from bucketing import precision
    from bucketing.engines import DTYPES as TORCH_DTYPES
    from bucketing.engines import open_reduced
    from bucketing.head import EngineError, load_head

    if handler.engine != "torch":
        raise BuildError(f"handler.dtype {handler.dtype} runs on engine torch; got engine {handler.engine}")
    measured = dataclasses.replace(handler, min_cosine=0.0, torchscript=False)
    try:
        head, info = load_head(handler.task, str(model_dir))
        with torch.inference_mode():
            engine = open_reduced(head, info, measured, str(model_dir), "cpu", TORCH_DTYPES[handler.dtype])
    except (EngineError, OSError, ValueError) as e:
        raise BuildError(f"--dtype {handler.dtype}: fidelity not measured ({str(e).splitlines()[0][:300]})") from None
    fidelity = getattr(engine, "fidelity", None)
    if fidelity is None:
        raise BuildError(f"--dtype {handler.dtype}: fidelity not measured")
    native = precision.native_bf16(precision.cpu_info())
    if handler.dtype != "bfloat16":  # float16: no CPU worker serves it
        where = f"on this CPU; {handler.dtype} is served on a CUDA GPU only"
    else:
        where = f"this CPU multiplies bfloat16 natively ({native})" if native else "this CPU emulates bfloat16"
    print(f"{fidelity.describe()} (measured at build; {where})")
    refusal = fidelity.refusal(handler.min_cosine)
    if refusal:
        raise BuildError(f"{refusal} (a worker would not start)")


def from_config(path: Path, name: str, out: Path, model_dir: Path | None = None) -> Path:
    """NAME.mar from a model-config YAML (checked first: its `handler:` section as the handler will read it)."""
    from bucketing.config import ConfigError, HandlerConfig

    try:
        cfg = yaml.safe_load(path.read_text())
        handler = HandlerConfig.from_yaml(cfg)
    except FileNotFoundError:
        raise BuildError(f"--config {path}: no such file") from None
    except (yaml.YAMLError, ConfigError) as e:
        raise BuildError(f"--config {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise BuildError(f"--config {path}: not a model-config (a mapping of keys)")
    return build_all({name: cfg}, model_dir or archives.minilm_dir(), handler.engine, handler.task, out)[0]


if __name__ == "__main__":
    sys.exit(main())
