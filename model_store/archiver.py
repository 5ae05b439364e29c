"""The archive's files and torch-model-archiver: `stage` lays out its extra files (the `bucketing/` package, the
model folder, an engine's exported graph), `build_all` runs the archiver once per model-config, `print_commands`
prints the command lines it would run instead. `model_store.build` runs them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from model_store import archives
from model_store.archive_spec import BuildError, Calibration, report_fidelity


def stage(staging: Path, model_dir: Path, engine: str, task: str, calibration: Calibration | None = None) -> Path:
    """Lay out the archive's extra files: `bucketing/` (from the installed sources) and `model/` (the folder's
    files and the folders of its sentence-transformers chain; for onnxruntime, with the exported graph; with
    `calibration` texts, the int8/uint8 ranges computed from them, `model_store.ranges`)."""
    if staging.exists():
        shutil.rmtree(staging)
    _, package = archives.handler_sources()
    skipped = shutil.ignore_patterns("__pycache__", *archives.NOT_ARCHIVED)  # no host rides in an archive
    shutil.copytree(package, staging / "bucketing", ignore=skipped)
    (staging / "model").mkdir(parents=True)
    for relative, source in archives.archived_files(model_dir):  # each checked to lie inside the model folder
        target = staging / "model" / relative
        if not target.resolve().is_relative_to(staging.resolve()):
            raise BuildError(f"{relative}: would be written outside the staging folder {staging}; refused")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    if calibration:
        stage_ranges(staging / "model", task, calibration)
    else:
        check_own_ranges(staging / "model")
    from bucketing.engine_registry import ENGINES
    from bucketing.model.head import EngineError

    try:
        ENGINES[engine].prepare_into(task, str(model_dir), staging / "model")
    except EngineError as e:
        raise BuildError(str(e)) from None
    return staging


def stage_ranges(model: Path, task: str, calibration: Calibration) -> None:
    """The staged model's int8/uint8 ranges from the calibration texts (a dense embedding model's only), the
    build line saying which texts."""
    from bucketing.model_kinds import MODEL_KINDS
    from bucketing.quantize import RANGES_FILE
    from model_store.ranges import MIN_TEXTS, write_ranges

    kind = MODEL_KINDS[task]
    if not kind.dense_vector:
        raise BuildError(f"--calibration-texts computes int8/uint8 ranges of dense embeddings; this is {kind.a_model}")
    texts = calibration.texts
    if len(texts) < 2:
        raise BuildError(f"--calibration-texts holds {len(texts)} texts; ranges need at least two")
    start = time.perf_counter()
    replaced = ", replacing the folder's own" if (model / RANGES_FILE).is_file() else ""
    write_ranges(model, list(texts), max_length=calibration.max_length)
    few = f" (ranges are steadier from {MIN_TEXTS} or more)" if len(texts) < MIN_TEXTS else ""
    print(
        f"# int8/uint8 ranges from {len(texts)} calibration texts{few}: {calibration.source}; "
        f"model/{RANGES_FILE}{replaced} ({time.perf_counter() - start:.1f} s; --no-calibration-texts for none)"
    )


def check_own_ranges(model: Path) -> None:
    """The staged folder's own `RANGES_FILE`, if any, read as the worker will read it (one line if it would refuse
    it), and the build line saying the archive carries it and from what."""
    from bucketing.model.chain import ChainError, read_chain
    from bucketing.quantize import RANGES_FILE, load_ranges

    path = model / RANGES_FILE
    if not path.is_file():
        return
    try:
        hidden = archives.hidden_size(model)  # its Transformer's config.json (T5: d_model)
        ranges = load_ranges(path, read_chain(model).dimensions(hidden) if hidden is not None else None)
    except (OSError, ValueError, TypeError, ChainError) as e:
        raise BuildError(f"the model folder's {RANGES_FILE}: {e}") from None
    texts = json.loads(path.read_text(encoding="utf-8")).get("texts")
    source = f"{texts} calibration texts" if texts else "calibration texts it does not count"
    cut = (
        "; it keeps no calibration vectors, so int8/uint8 with a re-normalised dimensions is refused: "
        "python -m model_store.ranges to compute it again"
        if ranges.calibration is None
        else ""
    )
    print(f"# int8/uint8 ranges: the folder's own model/{RANGES_FILE}, from {source}{cut}")


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
    configs: dict[str, dict[str, Any]],
    model_dir: Path,
    engine: str,
    task: str,
    out: Path,
    stage_dir: Path,
    calibration: Calibration | None = None,
) -> int:
    """Stage the files and model-configs into `stage_dir` and print the archiver command of each archive."""
    staging = stage(stage_dir / "extra", model_dir, engine, task, calibration)
    report_fidelity(configs, staging / "model")  # the staged folder: the engine's files (its graph) beside the model's
    from bucketing.engine_registry import ENGINES

    written = ENGINES[engine].files
    note = f"; {', '.join(written)} written for the {engine} engine" if written else ""
    model_files = sorted(p.name for p in (staging / "model").iterdir() if p.name not in written)
    _, package = archives.handler_sources()
    skipped = archives.left_out(model_dir)
    left = f"; left out, read by no loader: {', '.join(skipped)}" if skipped else ""
    print(
        f"# staged {shown(staging)}/: bucketing/ (the handler package, from {shown(package)}), model/ "
        f"({len(model_files)} files from {shown(model_dir)}"
        f"{note}{left})"
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


def build_all(
    configs: dict[str, dict[str, Any]],
    model_dir: Path,
    engine: str,
    task: str,
    out: Path,
    calibration: Calibration | None = None,
) -> list[Path]:
    """One archive per (name, model-config), sharing one staged model folder; their paths."""
    archiver = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent)) or shutil.which(
        "torch-model-archiver"
    )
    if not archiver:
        raise BuildError("torch-model-archiver not found: run `make venv` first")
    tmp = archives.ROOT / ".tmp"
    tmp.mkdir(exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    staging = stage(tmp / "staging", model_dir, engine, task, calibration)
    report_fidelity(configs, staging / "model")  # the staged folder: the engine's files (its graph) beside the model's
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
