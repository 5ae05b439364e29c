"""The handler in this process, as a TorchServe worker runs it: a stand-in for TorchServe's `Context`."""

from __future__ import annotations

from typing import Any


class LocalMetrics:
    """Records what the handler adds to TorchServe's metric cache."""

    def __init__(self) -> None:
        self.added: list[tuple[str, float, str, list[Any]]] = []

    def add_metric(
        self, name: str, value: float, unit: str, idx: Any = None, dimensions: Any = None, metric_type: Any = None
    ) -> None:
        self.added.append((name, value, unit, list(dimensions or [])))

    def totals(self) -> dict[str, float]:
        """Sums by metric name (all dimensions together)."""
        out: dict[str, float] = {}
        for name, value, _, _ in self.added:
            out[name] = out.get(name, 0) + value
        return out


class LocalContext:
    """What a handler reads from TorchServe's Context (model dir, model-config, request headers) and what it sets
    (per-request status and content type), for running a handler in process."""

    def __init__(self, handler_section: dict[str, Any], model_dir: str = ".", model_name: str = "local") -> None:
        self.model_name = model_name
        self.system_properties = {"model_dir": model_dir, "gpu_id": None, "batch_size": 8}
        self.model_yaml_config = {"handler": handler_section}
        self.metrics = LocalMetrics()
        self.headers: list[dict[str, Any]] = []
        self.status: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}
        self.response_headers: dict[int, dict[str, str]] = {}

    def with_requests(
        self,
        content_types: list[str | None],
        url_paths: list[str] | None = None,
        headers: list[dict[str, str]] | None = None,
    ) -> LocalContext:
        """Record per-request Content-Types, url_paths and headers the way TorchServe's RequestProcessor holds them."""
        paths = url_paths or [""] * len(content_types)
        extra = headers or [{}] * len(content_types)
        self.headers = [
            {**({"body": {"content-type": ct}} if ct else {}), "url_path": path, **more}
            for ct, path, more in zip(content_types, paths, extra)
        ]
        self.status.clear()
        self.content_types.clear()
        self.response_headers.clear()
        return self

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self.headers[idx] if idx < len(self.headers) else {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.status[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.response_headers.setdefault(idx, {})[key] = value
