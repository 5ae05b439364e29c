"""The layers, checked statically: no import runs back up, between the wings or between `bucketing`'s floors, and
no two modules import each other round a cycle.

Every module of the handler (the `bucketing` package and `bucketing_handler`), `model_store`, `tsctl` and `bench` is
parsed with `ast` (nothing is imported) and each import statement becomes an edge of the import graph, with its
line. What counts as an import:

- every `import a.b` and `from a.b import c` anywhere in the module: at its top, inside a function (a lazy import is
  still a dependency), and inside `if TYPE_CHECKING:` blocks, which COUNT: a name in an annotation ties the module to
  the one declaring it just as a call does, and an upward one is a sign the name lives on the wrong floor;
- `from a.b import c` is an edge to module `a.b.c` when that is a module, else to `a.b` (the name is an attribute);
  a relative import is resolved against its package;
- not counted: the parent packages Python runs on the way (`import a.b.c` runs `a/__init__` and `a/b/__init__`),
  dynamic imports (`importlib.import_module`: the model-kind registry names its task classes so), and imports of
  anything outside these four wings (the standard library, torch, ...).

The rules, each failing with the importing module, the line and the imported module:

(a) wings, bottom to top (`WINGS`): no module imports one of a higher wing, except the entries of `ALLOWED`, each
    explained there (and an entry no longer needed fails too, so it is removed);
(b) floors inside a wing that declares them (`FLOORS`; today `bucketing`): every module is placed in exactly one
    floor, and no module imports one of a higher floor (a module of the same floor is fine);
(c) no cycle: no strongly connected component of more than one module, and none between floors or wings either.

Extending: a new module of `bucketing` goes into `FLOORS` (the test names any module left out); a wing's floors
are one more entry of `FLOORS`, keyed by the wing.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Where each wing's modules live: (folder that holds it, its package folder or module file).
SOURCES = (
    ("handler", "bucketing"),
    ("handler", "bucketing_handler.py"),
    (".", "model_store"),
    (".", "tsctl"),
    (".", "bench"),
)

# The wings, bottom to top: a module may import its own wing and those below it.
WINGS: tuple[str, ...] = ("bucketing", "bucketing_handler", "model_store", "tsctl", "bench")

# Imports from a lower wing to a higher one that are allowed for now, by (importing module, imported module).
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Floor:
    """One floor of a wing: its name and the modules on it. An entry ending in `.*` is a package and everything
    below it; any other entry is exactly that module. A module is placed by its most specific entry (an exact one,
    else the longest package), so a package may be cut across floors by naming one of its modules elsewhere."""

    name: str
    modules: tuple[str, ...]


# `bucketing`'s floors, bottom to top: a module may import its own floor and those below it.
FLOORS: dict[str, tuple[Floor, ...]] = {
    "bucketing": (
        Floor(
            "ground: pure declarations and data, no torch",
            (
                "bucketing.sizes",
                "bucketing.heap",  # glibc's malloc_trim after a pass (ctypes)
                "bucketing.quantize",
                "bucketing.chunks",
                "bucketing.metrics",
                "bucketing.answers",
                "bucketing.model.chain",  # the sentence-transformers chain read from a folder's files (pure)
                "bucketing.engine_registry",
                "bucketing.model_kinds",
                "bucketing.config",
                "bucketing.settings_reference",  # the settings table, from config's declarations
            ),
        ),
        Floor("planning: the cost model, planner, scheduler and calibration (pure)", ("bucketing.planning.*",)),
        Floor("model: the model read from its folder (tokenizer, torch head)", ("bucketing.model.*",)),
        Floor("engines: one module per engine", ("bucketing.engines.*",)),
        # the sparse kind below its task, bottom to top: a route kind is handed what it needs, never imports upward
        Floor(
            "sparse_ground: a sparse route, what a route kind does, the graph's torch modules",
            ("bucketing.kinds.sparse.routes.base", "bucketing.kinds.sparse.heads"),
        ),
        Floor("sparse_route_kinds: one module per route kind", ("bucketing.kinds.sparse.routes.*",)),
        Floor("sparse_registry: ROUTE_KINDS", ("bucketing.kinds.sparse.routes",)),
        Floor("sparse_folder: a sparse folder read by its route kinds", ("bucketing.kinds.sparse.folder",)),
        Floor(
            "sparse_engines: its torch engines and graph engines",
            ("bucketing.kinds.sparse.engines", "bucketing.kinds.sparse.onnx"),
        ),
        Floor("kinds: the model kinds' task classes, on the engines", ("bucketing.kinds.*",)),
        Floor("protocols: the wire formats", ("bucketing.protocols.*",)),
        Floor("startup_checks: the settings against the loaded model", ("bucketing.startup_checks",)),
        Floor("serving: the serving loop and the continuous pool", ("bucketing.serving.*",)),
        Floor("worker: the one way to open a worker", ("bucketing.worker",)),
        Floor("hosts: servers other than TorchServe, over a worker", ("bucketing.hosts.*",)),
        Floor("facade: the package's public names", ("bucketing",)),
    ),
    "bench": (
        Floor("the package's docstring (the floors)", ("bench",)),
        Floor("inputs: what is measured (workloads, models, configurations, references)", ("bench.inputs.*",)),
        Floor("peers: other servers on the same load", ("bench.peers.*",)),
        Floor("harness: one compare run (flags, plan, load, measurement, results, report)", ("bench.harness.*",)),
        Floor(
            "run kinds, hosts and in-process probes, side by side",
            ("bench.kinds.*", "bench.hosts.*", "bench.probes.*"),
        ),
        Floor("the CLI", ("bench.compare",)),
    ),
}


@dataclass(frozen=True)
class Edge:
    """`importer` imports `imported` at `line`."""

    importer: str
    line: int
    imported: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_names(sources: Iterable[tuple[str, str]] = SOURCES, root: Path = ROOT) -> dict[str, Path]:
    """Every module of the wings by dotted name (a package by its own name, for its `__init__.py`)."""
    out: dict[str, Path] = {}
    for base, name in sources:
        path = root / base / name
        for file in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
            parts = file.relative_to(root / base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def imports_of(module: str, source: str, known: Iterable[str], package: bool = False) -> list[Edge]:
    """The edges of one module's source to the `known` modules (`package`: the source is a package's
    `__init__.py`, against which its relative imports resolve)."""
    known = set(known)

    def deepest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    here = module if package else module.rpartition(".")[0]
    edges: list[Edge] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str | None] = []
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [deepest(alias.name) for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in known else deepest(base))
        edges.extend(Edge(module, node.lineno, t) for t in targets if t is not None and t != module)
    return edges


def import_graph(modules: Mapping[str, Path]) -> list[Edge]:
    """Every edge between the modules, sorted."""
    edges: set[Edge] = set()
    for name, file in modules.items():
        edges.update(imports_of(name, file.read_text(encoding="utf-8"), modules, file.name == "__init__.py"))
    return sorted(edges, key=lambda e: (e.importer, e.line, e.imported))


def wing_of(module: str, wings: Sequence[str] = WINGS) -> int | None:
    """The rank of the module's wing (0: the lowest); None: in no wing."""
    top = module.partition(".")[0]
    return wings.index(top) if top in wings else None


def floor_of(module: str, floors: Sequence[Floor]) -> int | None:
    """The rank of the module's floor (0: the lowest), by its most specific entry; None: placed in none."""
    best: tuple[int, int] | None = None  # (specificity, floor)
    for rank, floor in enumerate(floors):
        for entry in floor.modules:
            if entry.endswith(".*"):
                package = entry[:-2]
                if module == package or module.startswith(package + "."):
                    score = len(package.split("."))
                else:
                    continue
            elif module == entry:
                score = 1000  # an exact entry beats any package
            else:
                continue
            if best is None or score > best[0]:
                best = (score, rank)
    return None if best is None else best[1]


def upward(edges: Iterable[Edge], rank: Callable[[str], int | None], names: Sequence[str]) -> list[str]:
    """Each edge from a lower rank to a higher one, as a line naming both ranks."""
    out = []
    for edge in edges:
        low, high = rank(edge.importer), rank(edge.imported)
        if low is not None and high is not None and low < high:
            out.append(f"{edge} (from {names[low]!r} up to {names[high]!r})")
    return out


def cycles(edges: Iterable[Edge], node: Callable[[str], str | None] = lambda m: m) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's), each sorted; `node` maps a module to
    its node (a floor, a wing; None: left out), so the same search finds cycles between floors or wings."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        a, b = node(edge.importer), node(edge.imported)
        if a is not None and b is not None and a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth: the longest import chain (tens), well within Python's limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_lines(edges: Sequence[Edge], component: Sequence[str], node: Callable[[str], str | None]) -> str:
    """A cycle, with the edges that close it."""
    inside = set(component)
    held = [
        str(e)
        for e in edges
        if node(e.importer) in inside and node(e.imported) in inside and node(e.importer) != node(e.imported)
    ]
    return f"cycle {' <-> '.join(component)}:\n    " + "\n    ".join(held)


MODULES = module_names()
EDGES = import_graph(MODULES)


def test_the_wings_are_found():
    assert {wing_of(m) for m in MODULES} == set(range(len(WINGS)))
    assert len(EDGES) > 100 and any(e.importer == "bucketing_handler" for e in EDGES)


def test_no_wing_imports_a_higher_wing():
    found = upward((e for e in EDGES if (e.importer, e.imported) not in ALLOWED), wing_of, WINGS)
    assert not found, "imports from a lower wing to a higher one:\n" + "\n".join(found)
    used = {(e.importer, e.imported) for e in EDGES}
    stale = [f"{a} -> {b}" for a, b in ALLOWED if (a, b) not in used]
    assert not stale, "ALLOWED entries no longer needed (remove them): " + ", ".join(stale)


@pytest.mark.parametrize("wing", sorted(FLOORS))
def test_every_module_has_its_floor(wing):
    floors = FLOORS[wing]
    entries = [entry for floor in floors for entry in floor.modules]
    assert len(entries) == len(set(entries)), f"{wing}: an entry of FLOORS is on two floors"
    unplaced = sorted(m for m in MODULES if wing_of(m) == WINGS.index(wing) and floor_of(m, floors) is None)
    assert not unplaced, (
        f"modules of {wing} on no floor: {', '.join(unplaced)}; add each to its floor in FLOORS[{wing!r}] "
        "(tests/unit/test_layering.py)"
    )


@pytest.mark.parametrize("wing", sorted(FLOORS))
def test_no_module_imports_a_higher_floor(wing):
    floors = FLOORS[wing]
    mine = [e for e in EDGES if wing_of(e.importer) == wing_of(e.imported) == WINGS.index(wing)]
    found = upward(mine, lambda m: floor_of(m, floors), [f.name.partition(":")[0] for f in floors])
    assert not found, f"imports from a lower floor of {wing} to a higher one:\n" + "\n".join(found)


def test_no_import_cycles():
    def floor(module: str) -> str | None:
        wing = module.partition(".")[0]
        if wing not in FLOORS:
            return None
        rank = floor_of(module, FLOORS[wing])
        return None if rank is None else f"{wing}/{FLOORS[wing][rank].name.partition(':')[0]}"

    def wing(module: str) -> str | None:
        return module.partition(".")[0]

    for what, node in (("modules", lambda m: m), ("floors", floor), ("wings", wing)):
        edges = [e for e in EDGES if (e.importer, e.imported) not in ALLOWED]
        found = [cycle_lines(edges, c, node) for c in cycles(edges, node)]
        assert not found, f"import cycles between {what}:\n" + "\n".join(found)


# The checker itself, on a synthetic package.

SYNTHETIC = {
    "pkg": "from pkg.top import run\n",  # the facade: the top floor
    "pkg.low": "import json\n\nfrom pkg import mid  # a back edge: low imports mid\n",
    "pkg.mid": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.low import x\n",
    "pkg.top": "def run():\n    from .mid import y\n    from . import low\n",
    "pkg.ring.a": "from pkg.ring import b\n",  # a cycle inside one floor
    "pkg.ring.b": "def f():\n    import pkg.ring.a\n",
    "pkg.ring": "",
    "pkg.stray": "",
}
SYNTHETIC_FLOORS = (
    Floor("low", ("pkg.low", "pkg.ring.*")),
    Floor("mid", ("pkg.mid", "pkg.ring.b")),  # ring.b cut from its package onto a higher floor
    Floor("top", ("pkg.top", "pkg")),
)


def synthetic_edges() -> list[Edge]:
    out: list[Edge] = []
    for name, source in SYNTHETIC.items():
        package = name in ("pkg", "pkg.ring")
        out.extend(imports_of(name, source, SYNTHETIC, package))
    return out


def test_the_checker_reads_every_kind_of_import():
    edges = {(e.importer, e.line, e.imported) for e in synthetic_edges()}
    assert edges == {
        ("pkg", 1, "pkg.top"),
        ("pkg.low", 3, "pkg.mid"),  # `from pkg import mid`: the module, not the package
        ("pkg.mid", 4, "pkg.low"),  # under TYPE_CHECKING
        ("pkg.top", 2, "pkg.mid"),  # relative, inside a function
        ("pkg.top", 3, "pkg.low"),
        ("pkg.ring.a", 1, "pkg.ring.b"),
        ("pkg.ring.b", 2, "pkg.ring.a"),  # `import pkg.ring.a` inside a function
    }


def test_the_checker_catches_a_back_edge_a_cycle_and_a_stray_module():
    edges = synthetic_edges()
    ranks = [f.name for f in SYNTHETIC_FLOORS]
    assert floor_of("pkg.ring.b", SYNTHETIC_FLOORS) == 1 and floor_of("pkg.ring", SYNTHETIC_FLOORS) == 0
    assert floor_of("pkg.stray", SYNTHETIC_FLOORS) is None  # placed nowhere: `pkg` names the facade alone
    back = upward(edges, lambda m: floor_of(m, SYNTHETIC_FLOORS), ranks)
    assert back == [
        "pkg.low:3 imports pkg.mid (from 'low' up to 'mid')",
        "pkg.ring.a:1 imports pkg.ring.b (from 'low' up to 'mid')",
    ]
    assert cycles(edges) == [["pkg.low", "pkg.mid"], ["pkg.ring.a", "pkg.ring.b"]]
    by_floor = cycles(edges, lambda m: ranks[rank] if (rank := floor_of(m, SYNTHETIC_FLOORS)) is not None else None)
    assert by_floor == [["low", "mid"]]
    assert "pkg.low:3 imports pkg.mid" in cycle_lines(edges, ["pkg.low", "pkg.mid"], lambda m: m)
