"""The planner's cost model fitted to this machine in process (the handler's own calibration), for `--suite tune`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from model_store.archives import SERVED

if TYPE_CHECKING:
    from bucketing.planning.planner import CostModel


def calibrated_cost(
    model_dir: str, engine: str, max_length: int = SERVED.max_length, dtype: str | None = None
) -> CostModel:
    """The planner's cost model fitted to this machine: the handler's own calibration, one thread, in process (in
    `dtype` where given: bfloat16 on the torch engine)."""
    import tempfile

    import torch

    from bucketing import worker
    from bucketing.config import HandlerConfig
    from bucketing.planning.planner import CostModel
    from model_store.archives import engine_model_dir

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = engine_model_dir(Path(model_dir), engine, "embedding", Path(tmp))
        config = HandlerConfig(engine=engine, torch_threads=1, dtype=dtype or HandlerConfig.dtype)
        return worker.calibrated(worker.load(config, str(folder)), max_length, CostModel())
