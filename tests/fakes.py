"""A stand-in for TorchServe's Context, recording what the handler sets per request."""

from __future__ import annotations

from typing import Any


class FakeMetrics:
    def __init__(self) -> None:
        self.added: list[tuple[str, float, str]] = []

    def add_metric(self, name, value, unit, idx=None, dimensions=None, metric_type=None) -> None:
        self.added.append((name, value, unit))

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, value, _ in self.added:
            out[name] = out.get(name, 0) + value
        return out


class FakeContext:
    def __init__(self, handler_section: dict[str, Any], model_dir: str = ".") -> None:
        self.model_name = "tiny"
        self.system_properties = {"model_dir": model_dir, "gpu_id": None, "batch_size": 8}
        self.model_yaml_config = {"handler": handler_section}
        self.metrics = FakeMetrics()
        self.headers: list[dict[str, Any]] = []
        self.status: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}

    def with_requests(self, content_types: list[str | None], url_paths: list[str] | None = None) -> FakeContext:
        """Record per-request Content-Types and url_paths the way TorchServe's RequestProcessor holds them."""
        paths = url_paths or [""] * len(content_types)
        self.headers = [
            {**({"body": {"content-type": ct}} if ct else {}), "url_path": path}
            for ct, path in zip(content_types, paths)
        ]
        self.status.clear()
        self.content_types.clear()
        return self

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self.headers[idx] if idx < len(self.headers) else {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.status[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value
