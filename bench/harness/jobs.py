"""Each configuration resolved once into a job before it is measured: its load (texts, request bodies, tokens as
served), the float32 references its answers are checked against, and the figures it is held to (the GEMM roofline,
and exact-length grouping where the plan asks for it). Loads, references and figures are shared between jobs that
need the same ones, each computed once per run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.inputs import models, traffic
from bench.inputs.configuration import Configuration
from bench.inputs.job import Bodies, Job
from bench.inputs.references import reference_embeddings
from bench.inputs.workloads import (
    DOCS_PER_REQUEST,
    NOT_EMBEDDINGS,
    RERANK,
    TEXTS_OF,
    Workload,
    make_workload,
    rerank_requests,
)
from model_store import archives

WORKLOAD_TEXTS = 2000  # texts drawn for a generated workload
FIDELITY_TEXTS = 32  # texts of the run, spread over its lengths, each configuration's answers are checked on
EXACT_LENGTH_TEXTS = 800  # texts of the workload the exact-length grouping runs

if TYPE_CHECKING:
    from bucketing.model.tokenizer import Tokenizer

__all__ = ["EXACT_LENGTH_TEXTS", "FIDELITY_TEXTS", "WORKLOAD_TEXTS", "Bodies", "Job", "Resolver"]


class Resolver:
    """Resolves configurations into jobs, computing each load, reference and figure once per run."""

    def __init__(
        self, out: Path, seed: int, texts: Workload | None = None, docs_per_request: int = DOCS_PER_REQUEST
    ) -> None:
        self.out, self.seed, self.texts, self.docs_per_request = out, seed, texts, docs_per_request
        self._loads: dict[tuple[str, float, str | None], Bodies] = {}
        self._references: dict[tuple[Path, tuple[str, ...]], list[list[float]]] = {}
        self._gemm_per_core: dict[str, float] = {}  # GEMM FLOP/s of one thread per dtype
        self._exact: dict[tuple[Any, ...], dict[str, Any]] = {}

    @property
    def exact_length_rates(self) -> list[dict[str, Any]]:
        """The exact-length grouping rates measured so far (bound.json), for the report."""
        return list(self._exact.values())

    def job(self, config: Configuration, *, exact: bool = False, check: bool = True) -> Job:
        """The job of `config`: `exact` adds the exact-length grouping rate; `check` the references (embeddings)."""
        load, folder = self.load(config), models.model_dir(config.model)
        picks: tuple[str, ...] = ()
        references = None
        if check and config.workload not in NOT_EMBEDDINGS:
            picks = tuple(load.spread(FIDELITY_TEXTS))
            references = self.references(folder, picks)
        exact_tps = self.exact_length(config, load, folder) if exact else None
        return Job(config, load, picks, references, self.roofline(config, load, folder), exact_tps)

    def load(self, config: Configuration) -> Bodies:
        """The texts of a configuration's workload (the user's file for `file:`), their bodies and token counts."""
        key = (config.workload, config.short_frac if config.workload == "mixed" else 0.0, config.model)
        if key not in self._loads:
            self._loads[key] = self._make_load(config)
        return self._loads[key]

    def _make_load(self, config: Configuration) -> Bodies:
        tokenizer = models.tokenizer(config.model, models.task(config.workload))  # as the archive cuts
        if config.workload == RERANK:
            return self._rerank_load(tokenizer)
        if config.workload.startswith(traffic.PREFIX):
            if self.texts is None or self.texts.name != config.workload:
                raise SystemExit(f"workload {config.workload}: give the file with --texts")
            w = self.texts
        else:
            texts = TEXTS_OF.get(config.workload, config.workload)
            w = make_workload(texts, WORKLOAD_TEXTS, self.seed, short_frac=config.short_frac)
        bodies = [json.dumps({"text": t}).encode() for t in w.texts]
        tokens = [len(e.ids) for e in tokenizer.encode(w.texts)]  # as served: cut at max_length
        return Bodies(w, bodies, tokens)

    def _rerank_load(self, tokenizer: Tokenizer) -> Bodies:
        """Cohere-style rerank bodies (a query, `docs_per_request` documents) and each request's pair tokens."""
        requests = rerank_requests(WORKLOAD_TEXTS // self.docs_per_request + 1, self.docs_per_request, self.seed)
        documents = tuple(d for _, docs in requests for d in docs)
        w = Workload(RERANK, documents, tuple(0 for _ in documents), self.seed)
        bodies = [json.dumps({"query": q, "documents": list(docs)}).encode() for q, docs in requests]
        pairs = [[len(e.ids) for e in tokenizer.encode_pairs([(q, d) for d in docs])] for q, docs in requests]
        return Bodies(w, bodies, [sum(p) for p in pairs], pairs)

    def references(self, folder: Path, picks: tuple[str, ...]) -> list[list[float]]:
        """Our float32 batch-of-one answers to `picks` from the model in `folder` (torch engine, in process)."""
        key = (folder, picks)
        if key not in self._references:
            self._references[key] = reference_embeddings(picks, folder)
        return self._references[key]

    def roofline(self, config: Configuration, load: Bodies, folder: Path) -> float:
        """The GEMM roofline of this configuration's dtype, model, texts and cores (real tokens/s)."""
        from bench.harness.roofline import gemm_flops_per_core, roofline_tokens_per_s

        dtype = config.dtype or "float32"
        if dtype not in self._gemm_per_core:
            self._gemm_per_core[dtype] = gemm_flops_per_core(dtype=dtype)
            print(f"{dtype} GEMM: {self._gemm_per_core[dtype] / 1e9:.1f} GFLOP/s per core (one thread)")
        lengths = load.lengths
        cores = min(config.workers * config.threads, os.cpu_count() or 1)
        mean = sum(lengths) / max(1, len(lengths))
        return roofline_tokens_per_s(models.encoder_dir(folder), mean, cores, self._gemm_per_core[dtype])

    def exact_length(self, config: Configuration, load: Bodies, folder: Path) -> float:
        """Exact-length grouping of this workload and worker layout in process (real tokens/s), once per run."""
        engine = config.engine or archives.default_engine()
        key = (config.workload_label, config.workers, config.threads, engine, config.model)
        if key not in self._exact:
            from bench.harness.exact_length import exact_length_rate

            w = load.workload
            layout = f"{config.workers} processes x {config.threads} thread"
            print(f"exact-length grouping: {w.label}, {layout}, {engine} ...")
            texts = w.texts[:EXACT_LENGTH_TEXTS]
            rate = exact_length_rate(texts, str(folder), config.workers, config.threads, engine=engine)
            self._exact[key] = {"workload": config.workload_label, "model": models.label(config.model), **rate}
            print(f"  {rate['tokens_per_s']:.0f} real tokens/s")
            (self.out / "bound.json").write_text(json.dumps(self.exact_length_rates, indent=1))
        return float(self._exact[key]["tokens_per_s"])
