"""Build TorchServe archives, one per padding strategy: `python -m model_store.build [--if-stale]`.

Each archive holds the handler module and the `bucketing` package copied from the installed sources, the model
files (under `model/`; all-MiniLM-L6-v2 from its package by default), and its model-config: the template
`config/minilm.yaml` with `handler.strategy` set (and `handler.torch_threads` for `--threads N` variants, named
`minilm-tN-<strategy>`). With `--config FILE --name NAME`, one archive NAME.mar from that model-config instead
(a tuned configuration, as `bench/compare.py --suite tune` writes it).

`--print-commands` stages the archive's files into `--stage-dir` (the `bucketing/` package, the model folder, the
exported ONNX graph for the onnxruntime and openvino engines), writes each archive's model-config beside them, and
prints the exact `torch-model-archiver` command line the build would run for each, building nothing: TorchServe's
own archiver, run by hand or in a user's own build, then makes the same archives.

This module is the CLI; the model folder's checks and each archive's model-config are in `archive_spec`, staging the
files and running the archiver in `archiver`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from bucketing.config import DTYPES, ENGINE_NAMES, SCHEDULES, TASKS
from bucketing.engine_registry import either
from model_store import archives, bulk
from model_store.archive_spec import STRATEGIES as STRATEGIES  # re-exported: the bench builds these by default
from model_store.archive_spec import ArchiveSpec as ArchiveSpec  # re-exported: the bench and tests import it here
from model_store.archive_spec import BuildError as BuildError
from model_store.archive_spec import parse_prompts
from model_store.archiver import build_all, print_commands


def build_archives(out: Path, spec: ArchiveSpec, if_stale: bool = False) -> list[Path]:
    """Build the spec's archives (with `if_stale`, only those missing or older than a source); their paths."""
    configs = spec.configs()
    if if_stale:
        configs = {n: cfg for n, cfg in configs.items() if archives.stale(out / f"{n}.mar", config=cfg)}
        if not configs:
            print("archives are up to date")
            return []
    handler = next(iter(configs.values()))["handler"]
    task = handler.get("task", "embedding")
    return build_all(
        configs, spec.folder, handler["engine"], task, out, spec.calibration(task, handler.get("max_length"))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=archives.STORE, help="where the .mar files go")
    parser.add_argument("--model-dir", type=Path, default=None, help="model files (default: the installed package)")
    parser.add_argument("--threads", type=int, default=None, help="threads per worker (names minilm-tN-*)")
    parser.add_argument(
        "--response-timeout",
        type=int,
        default=None,
        help="TorchServe's responseTimeout in each archive's model-config, seconds (default: the template's)",
    )
    parser.add_argument(
        "--bulk",
        action="store_true",
        help=f"the bulk registration's archives (`tsctl start --bulk`): --threads {bulk.BULK_THREADS} and a "
        "responseTimeout sized for a bulk request (model_store.bulk)",
    )
    parser.add_argument("--engine", choices=ENGINE_NAMES, help=f"{either(ENGINE_NAMES)} (default: the template's)")
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
        help="handler.dtype; bfloat16 (engine torch or openvino; served where the CPU multiplies it natively) prints "
        "its fidelity to float32, measured on the probe set here",
    )
    parser.add_argument(
        "--calibration-texts",
        type=Path,
        metavar="FILE",
        help="texts like those you serve, one a line (100 or more): the archive's fixed int8/uint8 ranges, "
        "computed with sentence-transformers (python -m model_store.ranges writes them into a folder instead); "
        "default for a dense embedding model: the bench's long-tail texts",
    )
    parser.add_argument(
        "--no-calibration-texts",
        action="store_true",
        help="no int8/uint8 ranges in the archive (int8/uint8 requests are then refused)",
    )
    parser.add_argument(
        "--truncate-dim",
        type=int,
        metavar="N",
        help="handler.truncate_dim: answer the first N components, as sentence-transformers' truncate_dim (after "
        "Normalize, not re-normalised); a request's dimensions at most N (default: the folder's own, if saved)",
    )
    args = parser.parse_args(argv)
    try:
        if args.calibration_texts is not None and args.no_calibration_texts:
            raise BuildError("--calibration-texts and --no-calibration-texts: give one")
        if args.config is not None and args.calibration_texts is not None:
            raise BuildError("--calibration-texts builds from --model-dir (or the bundled model), not --config")
        if args.config is not None:
            from_config(args.config, args.name, args.out, args.model_dir)
            return 0
        if args.bulk and args.threads not in (None, bulk.BULK_THREADS):
            raise BuildError(f"--bulk builds {bulk.BULK_THREADS}-thread archives; drop --threads {args.threads}")
        if args.response_timeout is not None and not 1 <= args.response_timeout <= 86400:
            raise BuildError(f"--response-timeout {args.response_timeout}: allowed 1 to 86400 seconds")
        timeout = args.response_timeout or (bulk.bulk_response_timeout_s() if args.bulk else None)
        spec = ArchiveSpec(
            strategies=[s.strip() for s in args.strategies.split(",") if s.strip()],
            threads=args.threads or (bulk.BULK_THREADS if args.bulk else 1),
            response_timeout=timeout,
            engine=args.engine,
            model_dir=args.model_dir,
            task=args.task if args.model_dir is not None else None,
            prefix=args.name,
            schedule=args.schedule,
            prompts=parse_prompts(args.prompt),
            default_prompt=args.default_prompt,
            max_length=args.max_length,
            dtype=args.dtype,
            calibration_texts=args.calibration_texts,
            truncate_dim=args.truncate_dim,
            calibrate=not args.no_calibration_texts,
        )
        if args.print_commands:
            configs = spec.configs()
            handler = next(iter(configs.values()))["handler"]  # the task as given or detected
            args.stage_dir.mkdir(parents=True, exist_ok=True)
            task = handler.get("task", "embedding")
            return print_commands(
                configs,
                spec.folder,
                handler["engine"],
                task,
                args.out,
                args.stage_dir,
                spec.calibration(task, handler.get("max_length")),
            )
        build_archives(args.out, spec, args.if_stale)
    except (BuildError, archives.ModelFolderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


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
