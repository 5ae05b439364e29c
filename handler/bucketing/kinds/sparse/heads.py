"""The sparse kind's torch side of the graph engines (onnxruntime; openvino), below its route kinds: what SPLADE
exports (`SpladeHead`) and what runs the exported graph in the torch engines' place (`OrtSpladeEngine` for SPLADE,
`OrtHead` for CSR's dense chain). `onnx` exports and opens the graph; each route kind says which of these it uses.

SPLADE: the graph runs (input_ids, attention_mask) to the pooled vocabulary-size vectors, the masked-LM logits,
the mask, relu, log1p and max or sum over the tokens inside it, so each run hands back rows x vocabulary floats,
not the rows x tokens x vocabulary logits (a copy of up to max_batch_tokens x vocabulary floats a row group, and on
a GPU a device-to-host transfer of them). Its output is [rows, pools, vocabulary], one pool per distinct (pooling,
activation) of the folder's SPLADE routes (`splade.pools`; one for every folder sentence-transformers saves but a
Router of two unlike SPLADE routes). ONNX has no log1p: its export, log(1 + x), rounds a positive x under 2^-24 to
0, which would drop an id encode() keeps. So max pools before log1p (monotone) and log1p is computed accurately on
the pooled vector; a sum that rounds to 0 takes the sum of the activations instead (log1p(x) is x there, in
float32). A sum over the tokens is accumulated in float64 and rounded to float32 once: ONNX Runtime's float32
ReduceSum put sums of 23-59 up to 1.9e-5 (5 float32 steps) off encode(), the float64 sum 7.6e-6 (encode()'s own
float32 rounding); it costs a float64 copy of the activations in the graph (twice the logits' size: with 16 rows of
128 tokens, the run's peak memory grew 1259 MiB where the float32 sum's grew 755 MiB; the logits are 238 MiB), which
the ready line says.
The engine runs it in row groups of at most max_batch_tokens tokens, as the torch engine does, so the ready line's
bound on a pass's logits holds on both engines; unlike torch's in-place pooling, the graph also holds activations
of the logits' size (the head's bias added, relu, log: ONNX Runtime plans those buffers), which the ready line says.

CSR: the graph is the dense chain's pooled embedding (`head.Head`, exported as the embedding kind's is); the
SparseAutoEncoder after it runs in torch float32 as on the torch engine (`CsrEngine`, its head the graph: `OrtHead`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) accurate for small x (x where 1 + x rounds to 1), from ops ONNX has."""
    u = x + 1.0
    d = u - 1.0
    tiny = d == 0
    return torch.where(tiny, x, torch.log(u) * (x / torch.where(tiny, torch.ones_like(d), d)))


class SpladeHead(torch.nn.Module):
    """The MLM transformer, then each of `pools`' SPLADE pooling: [rows, pools, vocabulary] float32."""

    pooled = False
    types = False
    inputs = ("input_ids", "attention_mask")
    output_axes = {0: "batch"}

    def __init__(self, model: torch.nn.Module, pools: tuple[tuple[str, str], ...]) -> None:
        super().__init__()
        self.model = model
        self.masks: Any = None  # for export: attention masks from plain tensor ops
        self.pools = pools

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        attention = attention_mask if self.masks is None else self.masks(attention_mask)
        logits = self.model(input_ids=input_ids, attention_mask=attention, return_dict=False)[0].float()
        x = torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype))
        out = []
        for pooling, activation in self.pools:
            if pooling == "max":  # log1p is monotone: after the max, on rows x vocabulary values
                pooled = log1p(torch.max(x, dim=1)[0])
                out.append(log1p(pooled) if activation == "log1p_relu" else pooled)
                continue
            raw = torch.sum(x, dim=1)  # log1p(x) = x in float32 where log(1 + x) rounds to 0
            y = torch.log(x + 1.0)
            if activation == "log1p_relu":
                y = torch.log(y + 1.0)
            summed = torch.sum(y.double(), dim=1).float()  # the exact sum, rounded once (the module's docstring)
            out.append(torch.where(summed == 0, raw, summed))
        return torch.stack(out, dim=1)


class OrtSpladeEngine:
    """SPLADE on the exported graph, in row groups of at most `group_tokens` tokens; a route's pool picked."""

    name = "onnxruntime"
    fidelity = None
    shadow = None

    def __init__(self, graph: Any, pools: tuple[tuple[str, str], ...], group_tokens: int) -> None:
        self.graph = graph
        self.device = graph.device
        self.pools = pools
        self.group_tokens = group_tokens

    def __call__(self, ids: np.ndarray, mask: np.ndarray, route: Any) -> np.ndarray:
        column = self.pools.index((route.pooling, route.activation))
        rows = max(1, self.group_tokens // max(1, ids.shape[1]))
        groups = [self.graph(ids[s : s + rows], mask[s : s + rows])[:, column] for s in range(0, ids.shape[0], rows)]
        return np.ascontiguousarray(np.concatenate(groups, axis=0), dtype=np.float32)


class OrtHead:
    """CSR's dense chain on the exported graph, called as `CsrEngine` calls its torch `Head`."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph

    def to(self, device: str) -> OrtHead:
        return self

    def eval(self) -> OrtHead:
        return self

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        pool = None if pool_mask is None else pool_mask.cpu().numpy()
        out = self.graph(input_ids.cpu().numpy(), attention_mask.cpu().numpy(), pool)
        return torch.from_numpy(out).to(input_ids.device)
