"""The planner's cost model fitted to this machine in process (the handler's own calibration), for `--suite tune`:
one per (engine, dtype), each engine opened as a worker opens it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from model_store.archives import SERVED

if TYPE_CHECKING:
    from bucketing.planning.planner import CostModel

ROUNDS = 3  # rounds over the (engine, dtype) pairs in turn; each shape's fastest median kept


def calibrated_costs(
    model_dir: str,
    pairs: Sequence[tuple[str, str]],
    max_length: int = SERVED.max_length,
    rounds: int = ROUNDS,
) -> dict[tuple[str, str], CostModel | str]:
    """The planner's cost model of each (engine, dtype) on this machine, one thread, in process: each opened as a
    worker opens it (`worker.load`: its start-up checks, a reduced dtype's fidelity gate; the exported graph written
    once for the engines that read it), then the handler's calibration shapes (`calibrate.measure`) timed `rounds`
    times, the pairs in turn each round so that a load on a shared machine falls on each alike (one pair: once, as
    its workers calibrate), and each shape's fastest median fitted (`calibrate.fit_cost`). A pair that does not open
    here gets its refusal, in one line."""
    import tempfile

    import torch

    from bench.inputs.engines import engine_kinds
    from bucketing import worker
    from bucketing.config import ConfigError, HandlerConfig
    from bucketing.engine_registry import DTYPE_KINDS
    from bucketing.kinds.task import Rows
    from bucketing.model.head import EngineError
    from bucketing.planning.calibrate import fit_cost, measure
    from bucketing.planning.planner import CostModel
    from model_store.archives import ModelFolderError, engine_model_dir

    torch.set_num_threads(1)
    out: dict[tuple[str, str], CostModel | str] = {}
    forwards = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders: dict[tuple[str, ...], Path] = {}  # by the files an engine reads: one export for the graph engines
        for engine, dtype in pairs:
            files = engine_kinds()[engine].files
            try:
                if files not in folders:
                    folders[files] = engine_model_dir(Path(model_dir), engine, "embedding", Path(tmp) / engine)
                config = HandlerConfig(
                    engine=engine_kinds()[engine].name, torch_threads=1, dtype=DTYPE_KINDS[dtype].name
                )
                model = worker.load(config, str(folders[files]))
            except (ConfigError, EngineError, ModelFolderError, ImportError) as e:
                out[(engine, dtype)] = " ".join(str(e).split())[:300]
                continue
            token = model.tokenizer.pad_id + 1

            def forward(rows: int, length: int, model: worker.Model = model, token: int = token) -> None:
                model.task.forward(Rows.plain(rows, length, token))

            forwards[(engine, dtype)] = forward
            out[(engine, dtype)] = CostModel()  # its place in the order; fitted below
        best: dict[tuple[str, str], dict[tuple[int, int], float]] = {pair: {} for pair in forwards}
        for _ in range(rounds if len(forwards) > 1 else 1):  # one engine: one round, as its workers calibrate
            for pair, forward in forwards.items():
                for rows, length, us in measure(forward, max_length):
                    best[pair][(rows, length)] = min(us, best[pair].get((rows, length), us))
    for pair, shapes in best.items():
        out[pair] = fit_cost([(r, n, us) for (r, n), us in shapes.items()], CostModel())
    return out


def calibrated_cost(
    model_dir: str, engine: str, max_length: int = SERVED.max_length, dtype: str | None = None
) -> CostModel:
    """One engine's cost model in `dtype` (float32 where None), as `calibrated_costs` fits it; a SystemExit that
    says why where the engine does not open here."""
    pair = (engine, dtype or "float32")
    cost = calibrated_costs(model_dir, [pair], max_length)[pair]
    if isinstance(cost, str):
        raise SystemExit(f"calibrating {engine} in {pair[1]}: {cost}")
    return cost
