"""The `torch` engine: the Hugging Face model, eager or traced with TorchScript (the trace is checked against eager
at load and dropped on any mismatch: both give the same numbers, the trace only faster); in a reduced dtype (float16
on CUDA; bfloat16 on CUDA or a CPU that multiplies it natively) its encoder runs in that dtype and the pooling and
Dense after it in float32, with its fidelity to float32 measured at load on the probe set (`precision`), and, with
`handler.fidelity_sample`, a share of the served texts run on a float32 copy as well (`shadow`)."""

from __future__ import annotations

import copy
import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bucketing.config import HandlerConfig
from bucketing.engine_registry import DTYPE_KINDS
from bucketing.engines import precision
from bucketing.engines.base import TOLERANCE, Engine, head_inputs, probe, probe_types
from bucketing.engines.shadow import Shadow
from bucketing.model.head import EngineError, Head, ModelInfo
from bucketing.model_kinds import MODEL_KINDS

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_KINDS}  # handler.dtype -> torch's


class TorchEngine:
    """The model on torch, eager or traced with TorchScript."""

    name = "torch"
    fidelity: precision.Fidelity | None = None  # a reduced dtype's, measured against float32 at load
    shadow: Shadow | None = None  # a reduced dtype's shadow checks (`handler.fidelity_sample`), with `reference`
    reference: TorchEngine | None = None  # the float32 model they run on

    def __init__(self, head: Head, device: str, dtype: torch.dtype, torchscript: bool, vocab_size: int) -> None:
        self.device = device
        self.head = head.to(device)
        self.head.model.to(dtype=dtype)  # the encoder only: pooling and Dense after it stay float32
        self.packed = pack_linears(self, vocab_size) if dtype == torch.bfloat16 and device == "cpu" else 0
        self.traced: torch.jit.ScriptModule | None = self._trace(vocab_size) if torchscript else None

    def _run(self, module: Any, *arrays: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(*(torch.from_numpy(a).to(self.device) for a in arrays))
            result: np.ndarray = out.float().cpu().numpy()
            return result

    def _trace(self, vocab_size: int) -> torch.jit.ScriptModule | None:
        ids, mask, pool_mask = probe(vocab_size)
        inputs = head_inputs(self.head, ids, mask, pool_mask, probe_types(mask))
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                first = torch.from_numpy(inputs[0][:2, :16]).to(self.device)
                ones = torch.ones((2, 16), dtype=torch.long, device=self.device)
                traced: torch.jit.ScriptModule = torch.jit.trace(
                    self.head, (first, *[ones] * (len(inputs) - 1)), strict=False
                )
            diff = float(np.abs(self._run(traced, *inputs) - self._run(self.head, *inputs)).max())
            if diff > TOLERANCE:
                raise ValueError(f"traced output differs from eager by {diff:.2e}")
            return traced
        except Exception as e:  # noqa: BLE001 - tracing is an optimisation; eager gives the same numbers
            logger.warning("TorchScript trace unusable (%s: %s); using the eager model", type(e).__name__, str(e)[:200])
            return None

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        module = self.traced if self.traced is not None else self.head
        out = self._run(module, *head_inputs(self.head, ids, mask, pool_mask, types))
        if self.shadow is not None and self.reference is not None:
            self._check(self.shadow, self.reference, out, ids, mask, pool_mask, types)
        return out

    has_states = True

    def states(self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None) -> tuple[Any, Any]:
        """An embedding model's pooled outputs and the encoder's token embeddings of one pass (eager)."""
        with torch.inference_mode():
            arrays = (ids, mask, mask if pool_mask is None else pool_mask)
            tensors = [torch.from_numpy(a).to(self.device) for a in arrays]
            pooled, tokens = self.head.states(*tensors)
            return pooled.float().cpu().numpy(), tokens.float().cpu().numpy()

    @staticmethod
    def _check(
        shadow: Shadow,
        reference: TorchEngine,
        out: np.ndarray,
        ids: np.ndarray,
        mask: np.ndarray,
        pool_mask: np.ndarray | None,
        types: np.ndarray | None,
    ) -> None:
        """Run the rows the shadow picks on the float32 model (cut to their longest) and record their cosines to
        `out`, which stays the answer."""
        rows = shadow.picks(ids, mask)
        if not rows:
            return
        width = int(np.flatnonzero(mask[rows].any(axis=0)).max()) + 1
        expected = reference(
            ids[rows, :width],
            mask[rows, :width],
            None if pool_mask is None else pool_mask[rows, :width],
            None if types is None else types[rows, :width],
        )
        shadow.record(precision.cosines(expected, out[rows]), mask[rows].sum(axis=1))


# oneDNN's linear on a weight it has reordered once (`mkldnn._reorder_linear_weight`), callable from TorchScript (a
# script function: the tracer cannot record its empty list of scalars).
PACKED_LINEAR = """
def run(x: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:
    scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", scalars, "")
"""


@functools.cache
def packed_linear() -> Any:
    return torch.jit.CompilationUnit(PACKED_LINEAR).run


class PackedLinear(torch.nn.Module):
    """A bfloat16 Linear layer on the CPU whose weight oneDNN reordered once, at load: torch's own bfloat16 linear
    reorders it on every pass (a 1x8 MiniLM pass spent 11% of its time in the allocator, and took 1.6x the time of
    this one; README, "Engines"). The same oneDNN kernels: the same numbers (checked at load, `pack_linears`)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = packed_linear()(x, self.packed, self.bias)
        return out


def pack_linears(engine: TorchEngine, vocab_size: int) -> int:
    """In place: the bfloat16 encoder's Linear layers as `PackedLinear`, kept only where the head then answers the
    padded probe inputs exactly as before (else, or on any failure, the layers as they were, logged); how many."""
    found = [
        (parent, name, child)
        for parent in engine.head.model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16
    ]
    if not found:
        return 0
    ids, mask, pool_mask = probe(vocab_size)
    inputs = head_inputs(engine.head, ids, mask, pool_mask, probe_types(mask))
    before = engine._run(engine.head, *inputs)
    try:
        for parent, name, child in found:
            setattr(parent, name, PackedLinear(child))
        diff = float(np.abs(engine._run(engine.head, *inputs) - before).max())
        if diff > 0:
            raise ValueError(f"its outputs differ from torch's own linear by {diff:.2e}")
    except Exception as e:  # noqa: BLE001 - packing is an optimisation; torch's own linear gives the same numbers
        for parent, name, child in found:
            setattr(parent, name, child)
        logger.warning("bfloat16 weights not prepacked (%s: %s); torch's own linear", type(e).__name__, str(e)[:200])
        return 0
    return len(found)


def open_torch(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    """The torch engine: the model as it is in float32, else `open_reduced`."""
    if dtype != torch.float32:
        return open_reduced(head, info, config, model_dir, device, dtype)
    return TorchEngine(head, device, dtype, config.torchscript, info.vocab_size)


def open_reduced(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    """The torch engine in a reduced dtype, its fidelity to the float32 model measured on `precision.probe_set`
    (an EngineError below `handler.min_cosine`); with `handler.fidelity_sample`, it keeps a float32 copy of the model
    for its shadow checks."""
    kept = copy.deepcopy(head) if config.fidelity_sample > 0 else head  # `head` turns to `dtype` below
    reference = TorchEngine(kept, device, torch.float32, False, info.vocab_size)
    engine: Engine = fidelity_gate(
        lambda: TorchEngine(head, device, dtype, config.torchscript, info.vocab_size),
        reference,
        info,
        config,
        model_dir,
    )
    return engine


def fidelity_gate(
    make: Callable[[], Any], reference: TorchEngine, info: ModelInfo, config: HandlerConfig, model_dir: str
) -> Any:
    """A reduced-precision engine (any engine: `make` opens it, after the float32 `reference` has run the probes;
    `fidelity`, `shadow` and `reference` are set on it) measured against `reference` on `precision.probe_set`: an
    EngineError (one line) below `handler.min_cosine`; with `handler.fidelity_sample`, its shadow checks run on
    `reference`."""
    from bucketing.model.tokenizer import Tokenizer

    tokenizer = Tokenizer(
        info.folder or model_dir, min(config.max_length, info.max_positions), bool(info.chain.do_lower_case)
    )
    classifier = MODEL_KINDS[config.task].classifier
    probes = precision.probe_set(tokenizer, pairs=classifier)
    expected = precision.run_probes(reference, probes, tokenizer.pad_id)
    engine = make()
    got = precision.run_probes(engine, probes, tokenizer.pad_id)
    kinds = [p.kind for p in probes]
    engine.fidelity = precision.measure(config.dtype, expected, got, classifier, info.activation, kinds)
    refusal = engine.fidelity.refusal(config.min_cosine)
    if refusal:
        raise EngineError(refusal)
    if config.fidelity_sample > 0:
        engine.shadow = Shadow(config.dtype, config.fidelity_sample, config.min_cosine)
        engine.reference = reference
    return engine
