"""Sparse encoders (sentence-transformers' `SparseEncoder`): the task that runs one exactly as
`SparseEncoder(dir).encode()`, `encode_query()` and `encode_document()` do (the folder is read in `sparse_folder`).

One route is chosen per request by its `input_type` as `encode_query` (`"query"`), `encode_document` (`"document"`)
and `encode()` (none) choose it. The answer is the vocabulary-size vector, cut to the model's `max_active_dims` (or
the request's) by torch's top-k of absolute values as sentence-transformers cuts it (`answers.keep_top`).

CSR (a `SparseAutoEncoder` over a dense chain): the pooled embedding as the embedding kind computes it (`head.Head`:
the same pooling and Dense layers; then Normalize if the chain has it), then the autoencoder's encoder as
sentence-transformers runs it at inference (its layer norm if `normalize`, minus `pre_bias`, the linear layer with
`latent_bias`), kept as relu of its latents; the answer's cut (`answers.keep_top`, k = max_active_dims, which the
folder's k defaults) then keeps exactly the positive values among the top k, as its top-k then relu does.

Memory: the MLM head's logits are rows x padded length x vocabulary floats; a pass is run in row groups of at
most `handler.max_batch_tokens` tokens (`SparseEngine`), so no pass holds more than max_batch_tokens x vocabulary
logits in any strategy, and the worker's ready line says that bound in bytes. A CSR pass holds no vocabulary
logits: rows x hidden_dim latents (4 bytes each) after the encoder's own activations.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .chain import Chain, ChainError
from .sparse_folder import (
    Route,
    SparseSpec,
    is_sparse,
    read_sparse,
    static_weights,
    tokenizer_file,
)
from .task import Rows, TaskHooks


def bytes_per_pass(max_batch_tokens: int, vocab_size: int) -> int:
    """The MLM logits one pass holds at most (float32): max_batch_tokens x vocabulary."""
    return max_batch_tokens * vocab_size * 4


class SparseEngine:
    """The MLM transformer, then SPLADE pooling, in row groups of at most `group_tokens` tokens (so the logits
    a pass holds stay within group_tokens x vocabulary floats), as sentence-transformers computes it."""

    name = "torch"
    fidelity = None

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
    """CSR: the dense chain's pooled embedding (`Head`), Normalize if the chain has it, then the SparseAutoEncoder's
    encoder, in sentence-transformers' order of operations; relu of the latents (the cut is the answer's)."""

    name = "torch"
    fidelity = None

    def __init__(self, head: Any, weights: Mapping[str, Any], route: Route, device: str) -> None:
        self.head = head.to(device).eval()
        self.normalize = bool(route.dense is not None and route.dense.normalize)
        self.layer_norm = route.layer_norm
        self.pre_bias = weights["pre_bias"].to(device)
        self.encoder = weights["encoder"].to(device)
        self.latent_bias = weights["latent_bias"].to(device)
        self.device = device

    def __call__(self, ids: np.ndarray, mask: np.ndarray, route: Route) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        with torch.inference_mode():
            i = torch.from_numpy(ids).to(self.device)
            m = torch.from_numpy(mask).to(self.device)
            x = self.head(i, m)
            if self.normalize:
                x = F.normalize(x, p=2, dim=-1)
            if self.layer_norm:  # SparseAutoEncoder.LN, eps 1e-5
                x = x - x.mean(dim=-1, keepdim=True)
                x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
            x = x - self.pre_bias
            latents = F.linear(x, self.encoder, self.latent_bias)
            return np.ascontiguousarray(F.relu(latents).cpu().numpy())


class SparseTask(TaskHooks):
    """A SparseEncoder: each row's route (its request's input_type), its vocabulary-size vector, and one answer
    per text (the non-zero ids and values, cut to max_active_dims)."""

    name = "sparse"
    labels = None
    routed = True  # the pipeline passes each row's input_type to `forward`

    @staticmethod
    def detects(folder: Path | str) -> bool:
        return is_sparse(folder)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> SparseTask:
        from .sparse_onnx import open_engine

        task = load_sparse_task(config, model_dir, gpu_id)
        task.engine = open_engine(task, config, model_dir)  # on onnxruntime: the graph, checked against torch
        return task

    @staticmethod
    def load_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
        """What the onnxruntime engine's graph is exported from (`sparse_onnx`)."""
        from .sparse_onnx import load_head

        return load_head(model_dir, attention)

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        return read_sparse(folder).chain

    @staticmethod
    def encoder_folder(folder: Path) -> tuple[Path, int | None] | None:
        """Its MLM transformer's folder, and the tokens its chain cuts at."""
        spec = read_sparse(folder)
        return folder / (spec.mlm or ""), spec.chain.max_seq_length

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        return read_sparse(folder).describe()

    def __init__(
        self,
        spec: SparseSpec,
        engine: SparseEngine | CsrEngine,
        vocab_size: int,
        max_positions: int,
        specials: tuple[int, int],
        weights: Mapping[str, np.ndarray],
        model_dir: str,
    ) -> None:
        self.spec = spec
        self.chain = spec.chain
        self.engine = engine
        self.dimensions = vocab_size
        self.max_positions = max_positions
        self.specials = specials  # special tokens before and after a text's own (a static route leaves them out)
        self.weights = dict(weights)
        self.tokenizer_dir = str(Path(model_dir) / (spec.mlm or ""))
        if isinstance(engine, CsrEngine):
            self.ready_note = (
                f", sparse model {spec.describe()}, CSR: no vocabulary logits; a pass holds rows x {vocab_size} "
                f"latents x 4 bytes ({vocab_size * 4} bytes a row) after the dense encoder's own activations"
            )
        else:
            per_pass = bytes_per_pass(engine.group_tokens, vocab_size) / 2**20
            self.ready_note = (
                f", sparse model {spec.describe()}, MLM logits per pass at most {engine.group_tokens} tokens x "
                f"{vocab_size} ids x 4 bytes = {per_pass:.0f} MiB (handler.max_batch_tokens, in every strategy)"
            )

    @property
    def settings(self) -> Chain:
        """The folder's prompts (and max_seq_length) live on its chain."""
        return self.chain

    def forward(self, rows: Rows) -> np.ndarray:
        """The sparse vectors (dense, vocabulary-size, float32) of a padded sub-batch, each row by its route."""
        ids, mask = rows.ids, rows.mask
        names = [self.spec.route(t) for t in (rows.input_types or (None,) * ids.shape[0])]
        out = np.zeros((ids.shape[0], self.dimensions), dtype=np.float32)
        for name in dict.fromkeys(names):
            picked = [r for r, n in enumerate(names) if n == name]
            route = self.spec.routes[name]
            if route.kind in ("splade", "csr"):  # beside another route's rows: padded only to its own longest
                width = ids.shape[1] if len(picked) == len(names) else int(mask[picked].sum(axis=1).max())
                out[picked] = self.engine(ids[picked, :width], mask[picked, :width], route)
                continue
            # static: each row's own tokens (between its special tokens) get their id's weight, once per id
            (before, after), weight = self.specials, self.weights[name]
            ends = mask[picked].sum(axis=1, keepdims=True) - after
            columns = np.arange(ids.shape[1])
            row, column = np.nonzero((columns >= before) & (columns < ends))
            which = np.asarray(picked)[row]
            tokens = ids[which, column]
            out[which, tokens] = weight[tokens]
        return out

    def refuse(self, encoded: Any, where: str, max_length: int) -> str | None:
        """Why a text cut at max_length is not served on a static route (sentence-transformers cuts it at its
        tokenizer's model_max_length, without special tokens, instead); None when served."""
        name = self.spec.route(encoded.input_type)
        if not encoded.truncated or self.spec.routes[name].kind != "static":
            return None
        room = max_length - sum(self.specials)
        return (
            f"{where} has more than {room} tokens: input_type {encoded.input_type!r} takes the model's static route "
            f"{name!r}, which sentence-transformers cuts elsewhere (at its tokenizer's model_max_length) than "
            f"max_length={max_length}; send a shorter text"
        )

    def answer(self, output: np.ndarray, encoded: Any) -> Any:
        from .answers import Answer

        return Answer(
            output, len(encoded.ids), encoded.truncated, sparse=True, max_active_dims=self.spec.max_active_dims
        )


def load_sparse_task(config: Any, model_dir: str, gpu_id: Any = None) -> SparseTask:
    """The sparse model on torch (float32: its kind refuses others), checked; EngineError in one line for what is
    not served."""
    import torch
    from transformers import AutoModelForMaskedLM

    from .engines import select_device
    from .head import EngineError, reduced_weights, usable_positions

    try:
        spec = read_sparse(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    folder = str(Path(model_dir) / (spec.mlm or ""))
    csr = next((r for r in spec.routes.values() if r.kind == "csr"), None)
    if csr is not None:
        return load_csr_task(spec, csr, model_dir, folder, gpu_id)
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    saved = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if saved != torch.float32:
        raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
    vocab = int(model.config.vocab_size)
    weights = {}
    try:
        mlm_tokenizer = tokenizer_file(model_dir, spec.mlm or "")
        for name, route in spec.routes.items():
            if route.kind == "static":
                if tokenizer_file(model_dir, route.folder) != mlm_tokenizer:
                    raise ChainError(
                        f"route {name!r} ({route.folder}) has a tokenizer other than the MLM transformer's; served: "
                        "one tokenizer for every route"
                    )
                weights[name] = static_weights(model_dir, route)
                if weights[name].shape[0] != vocab:
                    raise ChainError(f"route {name!r}: {weights[name].shape[0]} weights for a vocabulary of {vocab}")
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    if weights and spec.chain.do_lower_case:
        raise EngineError(
            f"{model_dir}: its MLM transformer lower-cases texts (do_lower_case) and its static route does not; "
            "one tokenization for both routes is served only without do_lower_case"
        )
    device = select_device(gpu_id, torch.cuda.is_available())
    engine = SparseEngine(model, device, config.max_batch_tokens)
    return SparseTask(spec, engine, vocab, usable_positions(model.config), specials(folder), weights, model_dir)


def load_csr_task(spec: SparseSpec, route: Route, model_dir: str, folder: str, gpu_id: Any) -> SparseTask:
    """CSR on torch float32: the dense chain's Head, then the SparseAutoEncoder's weights, checked."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel

    from .engines import select_device
    from .head import EngineError, Head, dense_layers, reduced_weights, usable_positions

    model = AutoModel.from_pretrained(folder).eval()
    saved = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if saved != torch.float32:
        raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
    assert route.dense is not None
    head = Head(model, pooled=True, chain=route.dense, dense=dense_layers(model_dir, route.dense))
    where = Path(model_dir) / route.pooling_folder
    state = load_file(str(where / "model.safetensors"))
    encoder = state.get("encoder.weight", state.get("decoder.linear.weight"))
    width = route.dense.dimensions(int(model.config.hidden_size))
    shapes = {
        "pre_bias": [width],
        "encoder": [route.hidden_dim, width],
        "latent_bias": [route.hidden_dim],
    }
    held = {"pre_bias": state.get("pre_bias"), "encoder": encoder, "latent_bias": state.get("latent_bias")}
    found = {name: (list(t.shape) if t is not None else None) for name, t in held.items()}
    if found != shapes or any(t is not None and t.dtype != torch.float32 for t in held.values()):
        raise EngineError(
            f"{model_dir}: module SparseAutoEncoder in {where}: expected float32 {shapes} for its config, holds {found}"
        )
    device = select_device(gpu_id, torch.cuda.is_available())
    engine = CsrEngine(head, held, route, device)
    return SparseTask(spec, engine, route.hidden_dim, usable_positions(model.config), specials(folder), {}, model_dir)


def specials(folder: str) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after a text's own."""
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(folder).backend_tokenizer
    backend.no_padding()  # a saved tokenizer.json may pad (sentence-transformers saves its padding)
    bare, full = backend.encode("a b", add_special_tokens=False).ids, backend.encode("a b").ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return start, len(full) - start - len(bare)
    raise ChainError(f"{folder}: cannot locate a text's tokens among its special tokens")
