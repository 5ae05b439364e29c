"""The sparse kind's torch engines: SPLADE (the masked LM, then SPLADE pooling) and CSR (a dense chain, then a
SparseAutoEncoder), each computed as sentence-transformers computes it; `sparse.SparseTask` runs them per route.

CSR (a `SparseAutoEncoder` over a dense chain): the pooled embedding as the embedding kind computes it (`head.Head`:
the same pooling over the same pooling mask, a prompt's tokens left out where the Pooling says `include_prompt:
false`, and Dense layers; then Normalize if the chain has it), then the autoencoder's encoder as
sentence-transformers runs it at inference (its layer norm if `normalize`, minus `pre_bias`, the linear layer with
`latent_bias`), kept as relu of its latents; the answer's cut (`answers.keep_top`, k = max_active_dims, which the
folder's k defaults; inside a Router, the route's own k, as SparseEncoder takes none from it) then keeps exactly the
positive values among the top k, as its top-k then relu does. A Router's CSR routes share its one transformer, each
with its own chain after it (`CsrEngine.add`).

Memory: the MLM head's logits are rows x padded length x vocabulary floats; a pass is run in row groups of at
most `handler.max_batch_tokens` tokens (`SparseEngine`), so no pass holds more than max_batch_tokens x vocabulary
logits in any strategy, and the worker's ready line says that bound in bytes. A CSR pass holds no vocabulary
logits: rows x hidden_dim latents (4 bytes each) after the encoder's own activations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bucketing.kinds.sparse.folder import Route


def bytes_per_pass(max_batch_tokens: int, vocab_size: int) -> int:
    """The MLM logits one pass holds at most (float32): max_batch_tokens x vocabulary."""
    return max_batch_tokens * vocab_size * 4


class SparseEngine:
    """The MLM transformer, then SPLADE pooling, in row groups of at most `group_tokens` tokens (so the logits
    a pass holds stay within group_tokens x vocabulary floats), as sentence-transformers computes it."""

    name = "torch"
    fidelity = None
    shadow = None

    def __init__(self, model: Any, device: str, group_tokens: int) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.group_tokens = group_tokens

    def __call__(self, ids: np.ndarray, mask: np.ndarray, route: Route) -> np.ndarray:
        import torch

        rows = max(1, self.group_tokens // max(1, ids.shape[1]))
        out = []
        with torch.inference_mode():
            for start in range(0, ids.shape[0], rows):
                i = torch.from_numpy(ids[start : start + rows]).to(self.device)
                m = torch.from_numpy(mask[start : start + rows]).to(self.device)
                logits = self.model(input_ids=i, attention_mask=m, return_dict=False)[0].float()
                x = logits.mul_(m.unsqueeze(-1).to(logits.dtype)).relu_().log1p_()  # in place: one logits tensor
                if route.activation == "log1p_relu":
                    x = x.log1p_()
                out.append((torch.max(x, dim=1)[0] if route.pooling == "max" else torch.sum(x, dim=1)).cpu().numpy())
                del logits, x  # before the next group's logits are made
        return np.concatenate(out, axis=0)


class CsrEngine:
    """CSR: the dense chain's pooled embedding (`Head`, over the pooling mask: prompt tokens left out where its
    Pooling says `include_prompt: false`), Normalize if the chain has it, then the SparseAutoEncoder's encoder, in
    sentence-transformers' order of operations; relu of the latents (the cut is the answer's). One such chain per
    CSR route of a Router (`add`), keyed by the route's module folders (two routes may share an autoencoder and
    differ in pooling), all over one transformer."""

    name = "torch"
    fidelity = None
    shadow = None

    def __init__(self, head: Any, weights: Mapping[str, Any], route: Route, device: str) -> None:
        self.device = device
        self.parts: dict[tuple[str, ...], tuple[Any, bool, bool, Any, Any, Any]] = {}
        self.add(head, weights, route)

    def add(self, head: Any, weights: Mapping[str, Any], route: Route) -> None:
        """Another CSR route's dense chain (its own Head over the shared transformer) and autoencoder weights."""
        self.parts[route.modules] = (
            head.to(self.device).eval(),
            bool(route.dense is not None and route.dense.normalize),
            route.layer_norm,
            weights["pre_bias"].to(self.device),
            weights["encoder"].to(self.device),
            weights["latent_bias"].to(self.device),
        )

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, route: Route, pool_mask: np.ndarray | None = None
    ) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        head, normalize, layer_norm, pre_bias, encoder, latent_bias = self.parts[route.modules]
        with torch.inference_mode():
            i = torch.from_numpy(ids).to(self.device)
            m = torch.from_numpy(mask).to(self.device)
            x = head(i, m, None if pool_mask is None else torch.from_numpy(pool_mask).to(self.device))
            if normalize:
                x = F.normalize(x, p=2, dim=-1)
            if layer_norm:  # SparseAutoEncoder.LN, eps 1e-5
                x = x - x.mean(dim=-1, keepdim=True)
                x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
            x = x - pre_bias
            latents = F.linear(x, encoder, latent_bias)
            return np.ascontiguousarray(F.relu(latents).cpu().numpy())
