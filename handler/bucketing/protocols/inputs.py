"""A request's inputs, checked the same in every wire format: a text (not empty, encodable as UTF-8), a list of
texts, a classification model's list of [query, document] pairs, and the 413 for a list over max_texts; each
raises the client's mistake. Pure."""

from __future__ import annotations

from typing import Any

from bucketing.protocols.base import Limits, Pair, TooLarge, bad, json_type


def check_text(text: str, where: str) -> None:
    """A text must hold something besides white space, and be encodable as UTF-8."""
    if not text.strip():
        raise bad("EmptyText", f"{where} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad("InvalidEncoding", f"{where} holds a lone surrogate at character {e.start}") from None


def texts(value: Any, where: str, max_texts: int) -> tuple[str, ...]:
    """A non-empty list of at most max_texts texts; errors name `where` and the index."""
    if not isinstance(value, list):
        raise bad("InvalidType", f'"{where}" must be a list of strings, got {json_type(value)}', where)
    if not value:
        raise bad("EmptyText", f'"{where}" is an empty list', where)
    if len(value) > max_texts:
        raise too_many(len(value), where, max_texts)
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise bad("InvalidType", f"{where}[{i}] must be a string, got {json_type(t)}", where)
        check_text(t, f"{where}[{i}]")
    return tuple(value)


def pairs(value: Any, where: str, limits: Limits) -> tuple[Pair, ...]:
    """A non-empty list of at most max_texts [query, document] pairs of texts, for a classification model."""
    if not limits.kind.classifier:
        raise bad(
            "InvalidRequest",
            f'"{where}": text pairs need a classification model (a cross-encoder); this is {limits.kind.a_model}',
            where,
        )
    if not isinstance(value, list):
        raise bad("InvalidType", f'"{where}" must be a list of [query, document] pairs, got {json_type(value)}', where)
    if not value:
        raise bad("EmptyText", f'"{where}" is an empty list', where)
    if len(value) > limits.max_texts:
        raise too_many(len(value), where, limits.max_texts)
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            size = f" of {len(pair)} items" if isinstance(pair, list) else ""
            raise bad(
                "InvalidType",
                f"{where}[{i}] must be a [query, document] pair of two strings, got {json_type(pair)}{size}",
                where,
            )
        check_text(pair[0], f"{where}[{i}][0]")
        check_text(pair[1], f"{where}[{i}][1]")
        out.append(Pair(pair[0], pair[1]))
    return tuple(out)


def too_many(count: int | None, where: str, max_texts: int) -> TooLarge:
    """More than max_texts items; `count` None when they were not all counted (it stopped past the limit)."""
    has = f"{count} items" if count is not None else f"more than {max_texts} items"
    return TooLarge(
        "TooManyTexts",
        f'"{where}" has {has}; at most {max_texts} per request (handler.max_texts_per_request): send them in '
        "several requests",
        where,
    )
