"""The autoscaling recipes (config/autoscaling/, and any query under config/kserve/) checked without a cluster:
every YAML parses as Kubernetes objects, and every series a PromQL query, a Prometheus-adapter rule or an HPA's
metric names is one a host emits (`bucketing.metrics.host_series_names`: the one declaration) or TorchServe's own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from bucketing.metrics import CAPACITY, QUEUE_SECONDS, QUEUE_TOKENS, host_series_names
from model_store.archives import ROOT
from tests.unit.test_metrics import torchserve_metric_names

FOLDERS = (ROOT / "config" / "autoscaling", ROOT / "config" / "kserve")
QUERY_KEYS = ("query", "metricsQuery", "seriesQuery")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def manifests() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in folder.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def strings_under(node: Any, keys: tuple[str, ...]) -> Iterator[str]:
    """Every string value of the given keys, anywhere in a parsed document (adapter rules inside a ConfigMap's
    `config.yaml` included)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in keys and isinstance(v, str):
                yield v
            elif isinstance(v, str) and k.endswith(".yaml"):
                yield from strings_under(yaml.safe_load(v), keys)
            else:
                yield from strings_under(v, keys)
    elif isinstance(node, list):
        for v in node:
            yield from strings_under(v, keys)


def promql_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords, label names
    (inside braces, `by (...)`) nor template parts (`<<.Series>>`)."""
    expr = re.sub(r"<<[^>]*>>", " ", expr)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    found = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", expr):
        rest = expr[m.end() :].lstrip()
        if rest.startswith("(") or m[0] in KEYWORDS or re.fullmatch(r"\d.*|e\d+", m[0]):
            continue
        found.add(m[0])
    return found


def adapter_aliases(doc: dict[str, Any]) -> dict[str, set[str]]:
    """A Prometheus-adapter rule's exposed name (`name.as`) -> the series its `seriesQuery` selects."""
    out: dict[str, set[str]] = {}
    for text in (v for k, v in (doc.get("data") or {}).items() if k.endswith(".yaml")):
        for rule in (yaml.safe_load(text) or {}).get("rules", []):
            alias = rule.get("name", {}).get("as")
            if alias:
                out[alias] = promql_names(rule["seriesQuery"])
    return out


def hpa_metric_names(doc: dict[str, Any]) -> set[str]:
    if doc.get("kind") != "HorizontalPodAutoscaler":
        return set()
    return {m[m["type"].lower()]["metric"]["name"] for m in doc["spec"]["metrics"] if m["type"] != "Resource"}


def test_every_manifest_parses_as_kubernetes_objects():
    assert {p.name for p in (ROOT / "config" / "autoscaling").glob("*.yaml")} >= {
        "keda-scaledobject.yaml",
        "kserve-inferenceservice.yaml",
        "hpa-prometheus-adapter.yaml",
    }
    for path in manifests():
        for doc in documents(path):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path


def test_every_series_a_recipe_names_is_one_a_host_emits():
    known = host_series_names() | torchserve_metric_names()
    used: dict[str, set[str]] = {}
    aliases: dict[str, set[str]] = {}
    docs = [(path, doc) for path in manifests() for doc in documents(path)]
    for _, doc in docs:
        aliases |= adapter_aliases(doc)
    for path, doc in docs:
        names = set().union(*(promql_names(q) for q in strings_under(doc, QUERY_KEYS)))
        for name in hpa_metric_names(doc):
            names |= aliases.get(name, {name})
        used[path.name] = used.get(path.name, set()) | names
    every = set().union(*used.values())
    assert every and every <= known, {p: sorted(n - known) for p, n in used.items() if n - known}
    assert {QUEUE_TOKENS, CAPACITY, f"{QUEUE_SECONDS}_bucket"} <= every
    assert (
        used["keda-scaledobject.yaml"] and used["kserve-inferenceservice.yaml"] and used["hpa-prometheus-adapter.yaml"]
    )


def test_the_promql_reader_finds_metric_names_only():
    expr = 'histogram_quantile(0.9, sum by (le) (rate(bucket_queue_seconds_bucket{ModelName="m"}[2m]))) / 1e3'
    assert promql_names(expr) == {"bucket_queue_seconds_bucket"}
    assert promql_names("sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)") == set()
    assert promql_names("sum(a_total) / max(b) and on (pod) c > 0.5") == {"a_total", "b", "c"}
