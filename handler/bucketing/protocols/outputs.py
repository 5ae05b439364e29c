"""A request's choice among a multi-output model's outputs (BGE-M3: `dense`, `sparse`, `colbert`, from one pass):
`"outputs": [...]` (default: dense alone) and `"sparse_tokens": true` (the sparse output's token strings too), read
for every wire format that takes our options; and the one-line refusal of a format whose answer cannot carry an
output. A kind takes them when its `options` name "outputs". Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bucketing.answers import Options
from bucketing.model_kinds import Kind
from bucketing.protocols.base import Limits, bad, json_type, quote

OUTPUTS = ("dense", "sparse", "colbert")
DEFAULT = ("dense",)  # what a request that names none is answered
FIELDS = ("outputs", "sparse_tokens")  # the request fields (`options.OPTION_FIELDS`)
ROUTES = {
    "dense": "our JSON, KServe v1/v2, OpenAI's v1/embeddings, TEI's .../embed, Cohere's v2/embed",
    "sparse": 'our JSON and KServe v1 ("outputs"), KServe v2, TEI\'s .../embed_sparse',
    "colbert": 'our JSON and KServe v1 ("outputs"), KServe v2, TEI\'s .../embed_all',
}


def takes_outputs(kind: Kind) -> bool:
    """Whether a model of this kind answers several outputs, chosen per request."""
    return "outputs" in kind.options


def offers(kind: Kind, output: str) -> bool:
    """Whether a model of this kind answers this output (beside what its head says)."""
    return takes_outputs(kind) and output in OUTPUTS


def read_outputs(body: Mapping[str, Any], limits: Limits, fields: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """The outputs asked (in the request's order; () when none: `DEFAULT`) and whether the sparse output's token
    strings are; the client's 400 in one line for anything else, or for a model that answers one output."""
    value = body.get("outputs") if "outputs" in fields else None
    tokens = body.get("sparse_tokens") if "sparse_tokens" in fields else None
    if value is None and tokens is None:
        return (), False
    kind = limits.kind
    if not takes_outputs(kind):
        name = "outputs" if value is not None else "sparse_tokens"
        raise bad(
            "InvalidRequest",
            f'"{name}" is for BGE-M3 models (dense, sparse and ColBERT outputs of one pass); this is {kind.a_model}',
            name,
        )
    asked: tuple[str, ...] = ()
    if value is not None:
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v in OUTPUTS for v in value)
            or len(set(value)) != len(value)
        ):
            raise bad(
                "InvalidRequest",
                f'"outputs" must be a list of distinct names among {", ".join(map(repr, OUTPUTS))}, got '
                f"{quote(value, 60)}",
                "outputs",
            )
        asked = tuple(value)
    if tokens is not None and not isinstance(tokens, bool):
        raise bad("InvalidType", f'"sparse_tokens" must be true or false, got {json_type(tokens)}', "sparse_tokens")
    if tokens and "sparse" not in asked:
        raise bad(
            "InvalidRequest",
            '"sparse_tokens" gives the sparse output\'s tokens: ask it with "outputs": [..., "sparse"]',
            "sparse_tokens",
        )
    return asked, bool(tokens)


def refuse_beyond(asked: Sequence[str], carried: Sequence[str], wire: str) -> None:
    """The client's 400 naming where they are answered, when a request asks outputs its format cannot carry."""
    beyond = [o for o in asked if o not in carried]
    if beyond:
        where = "; ".join(f"{o}: {ROUTES[o]}" for o in beyond)
        raise bad(
            "InvalidRequest",
            f'"outputs" {", ".join(map(repr, beyond))}: {wire} carries {" and ".join(carried)} only; '
            f"answered at {where}",
            "outputs",
        )


# KServe v2's tensors of each output (a ragged output as flat values and a length per input: `kserve_v2.outputs`).
V2_TENSORS = {
    "dense": ("embedding",),
    "sparse": ("sparse_indices", "sparse_values", "sparse_lengths", "sparse_tokens"),
    "colbert": ("colbert", "colbert_lengths"),
}


def v2_tensors() -> tuple[str, ...]:
    """Every tensor a multi-output model's v2 answer can hold, in answer order (then `tokens`, `truncated`)."""
    return tuple(t for output in OUTPUTS for t in V2_TENSORS[output])


def asked_by_tensors(options: Options, tensors: Sequence[str]) -> Options:
    """A v2 request's options with the outputs its named tensors need added (`sparse_tokens` by its tensor)."""
    needed = [o for o in OUTPUTS if any(t in tensors for t in V2_TENSORS[o])]
    asked = tuple(dict.fromkeys((*options.outputs, *needed)))
    return replace(options, outputs=asked, sparse_tokens=options.sparse_tokens or "sparse_tokens" in tensors)


def ragged_vectors(name: str, column: Sequence[Any]) -> list[dict[str, Any]]:
    """Vectors per input (a list of lists, or an array [vectors, dim]) as two tensors: `name` FP32 [all vectors, dim]
    (the inputs' in order; one array where each input's is one) and `name_lengths` INT64 [n] (each input's count)."""
    flat: Any
    if all(isinstance(row, np.ndarray) and row.ndim == 2 for row in column):
        width = int(column[0].shape[1])
        flat = np.concatenate([row.reshape(-1) for row in column])
    else:
        width = next(len(row[0]) for row in column if len(row))
        flat = [x for row in column for vector in row for x in vector]
    lengths = [len(row) for row in column]
    return [
        {"name": name, "datatype": "FP32", "shape": [sum(lengths), width], "data": flat},
        {"name": f"{name}_lengths", "datatype": "INT64", "shape": [len(column)], "data": lengths},
    ]


def ragged_sparse(name: str, column: Sequence[Any]) -> list[dict[str, Any]]:
    """A sparse vector per input ({"indices", "values"}, and "tokens" where asked) as flat tensors `name_indices`
    INT64, `name_values` FP32 (and `name_tokens` BYTES) [all non-zeros], and `name_lengths` INT64 [n]."""
    lengths = [len(row["indices"]) for row in column]
    total = sum(lengths)
    out = [
        {
            "name": f"{name}_indices",
            "datatype": "INT64",
            "shape": [total],
            "data": [i for r in column for i in r["indices"]],
        },
        {
            "name": f"{name}_values",
            "datatype": "FP32",
            "shape": [total],
            "data": [v for r in column for v in r["values"]],
        },
        {"name": f"{name}_lengths", "datatype": "INT64", "shape": [len(column)], "data": lengths},
    ]
    if "tokens" in column[0]:
        out.append(
            {
                "name": f"{name}_tokens",
                "datatype": "BYTES",
                "shape": [total],
                "data": [t for r in column for t in r["tokens"]],
            }
        )
    return out
