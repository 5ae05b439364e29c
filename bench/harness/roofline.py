"""The real limit of a configuration: the machine's measured GEMM rate in its dtype over the model's FLOPs per real
token (float32; bfloat16, which a CPU with AMX multiplies several times faster).

An encoder's work is almost all matrix products: per token and layer, the attention projections (4 d x d) and
the feed-forward (2 d x ff), two FLOPs a multiply-add, plus attention's scores and mix (4 x length x d); a masked
LM (SPLADE) adds its head per token (d x d, then d x vocabulary). The
roofline is `cores x GEMM FLOP/s per core / FLOPs per token`: no engine or schedule runs real tokens faster.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def flops_per_token(model_dir: Path, mean_length: float) -> float:
    """Forward FLOPs per real token of a BERT-family encoder (from its config.json) at this mean text length."""
    cfg = json.loads((model_dir / "config.json").read_text())
    d: int = cfg.get("hidden_size") or cfg.get("dim")
    ff: int = cfg.get("intermediate_size") or cfg.get("hidden_dim") or 4 * d
    layers: int = cfg.get("num_hidden_layers") or cfg.get("n_layers")
    encoder = layers * (2 * (4 * d * d + 2 * d * ff) + 4 * mean_length * d)
    if any(str(a).endswith("ForMaskedLM") for a in cfg.get("architectures") or ()):  # SPLADE: the MLM head per token
        vocab: int = cfg["vocab_size"]
        return encoder + 2 * (d * d + d * vocab)
    return encoder


def gemm_flops_per_core(
    seconds: float = 1.0, n: int = 384, m: int = 1536, rows: int = 512, dtype: str = "float32"
) -> float:
    """The best matmul rate of one thread in `dtype` over `seconds` (at least one timing; the shapes of a
    MiniLM-sized feed-forward)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kind = getattr(torch, dtype)
        a, b = torch.randn(rows, n, dtype=kind), torch.randn(n, m, dtype=kind)
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            for _ in range(10):
                torch.mm(a, b)
            best = max(best, 10 * 2 * rows * n * m / (time.perf_counter() - start))
        return best
    finally:
        torch.set_num_threads(threads)


def roofline_tokens_per_s(model_dir: Path, mean_length: float, cores: int, per_core: float) -> float:
    return cores * per_core / flops_per_token(model_dir, mean_length)
