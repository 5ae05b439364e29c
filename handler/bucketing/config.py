"""Typed handler configuration, read once from model-config.yaml's `handler:` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

TASKS = ("embedding", "classification")
STRATEGIES = ("bucketed", "dynamic", "static")
OVERFLOW = ("truncate", "reject")

# The largest position count of BERT-family encoders; the model's own limit is checked at load.
MAX_LENGTH_CAP = 8192


class ConfigError(ValueError):
    """A bad value in the `handler:` section; the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class CostConfig:
    """The planner's cost model: calibrated at worker start, or taken from these constants."""

    calibrate: bool = True
    forward_overhead_us: float = 5000.0
    per_token_us: float = 230.0
    per_token_sq_us: float = 0.2


@dataclass(frozen=True)
class HandlerConfig:
    task: str = "embedding"
    strategy: str = "bucketed"
    model_path: str = "model"
    max_length: int = 256
    max_batch_tokens: int = 8192
    pad_to_multiple_of: int = 1
    max_texts_per_request: int = 32
    max_response_bytes: int = 6553500  # TorchServe's max_response_size (its default); a larger answer is a 413
    on_overflow: str = "truncate"
    torch_threads: int = 1
    normalize: bool = True
    torchscript: bool = True
    cost: CostConfig = field(default_factory=CostConfig)

    @classmethod
    def from_yaml(cls, model_yaml_config: Mapping[str, Any] | None) -> HandlerConfig:
        """Build from the whole model-config.yaml mapping (TorchServe's `context.model_yaml_config`)."""
        section = (model_yaml_config or {}).get("handler") or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"handler: expected a mapping, got {type(section).__name__}")
        return cls.from_mapping(section)

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> HandlerConfig:
        known = {f.name for f in fields(cls)}
        _reject_unknown("handler", section, known)
        values: dict[str, Any] = {}
        for key in ("task", "strategy", "on_overflow"):
            if key in section:
                values[key] = _choice(f"handler.{key}", section[key], _CHOICES[key])
        if "model_path" in section:
            values["model_path"] = _string("handler.model_path", section["model_path"])
        for key, (low, high) in _INT_RANGES.items():
            if key in section:
                values[key] = _integer(f"handler.{key}", section[key], low, high)
        for key in ("normalize", "torchscript"):
            if key in section:
                values[key] = _boolean(f"handler.{key}", section[key])
        if "cost" in section:
            values["cost"] = _cost(section["cost"])
        config = cls(**values)
        config._check_budget()
        return config

    def _check_budget(self) -> None:
        longest = -(-self.max_length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        if self.max_batch_tokens < longest:
            raise ConfigError(
                f"handler.max_batch_tokens: got {self.max_batch_tokens}; allowed: at least "
                f"max_length rounded up to pad_to_multiple_of ({longest}), so one text always fits"
            )


_CHOICES = {"task": TASKS, "strategy": STRATEGIES, "on_overflow": OVERFLOW}
_INT_RANGES = {
    "max_length": (1, MAX_LENGTH_CAP),
    "max_batch_tokens": (1, 1 << 22),
    "pad_to_multiple_of": (1, 512),
    "max_texts_per_request": (1, 4096),
    "max_response_bytes": (1024, 1 << 31),
    "torch_threads": (1, 256),
}
_COST_FLOATS = {
    "forward_overhead_us": (0.0, 1e7),
    "per_token_us": (0.0, 1e6),
    "per_token_sq_us": (0.0, 1e6),
}


def _reject_unknown(where: str, section: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(str(k) for k in section if k not in known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key}: got {value!r}; allowed: {' | '.join(allowed)}")
    return value


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: got {value!r}; allowed: a non-empty path string")
    return value


def _integer(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: got {value!r}; allowed: an integer from {low} to {high}")
    return value


def _number(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{key}: got {value!r}; allowed: a number from {low:g} to {high:g}")
    return float(value)


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}; allowed: true | false")
    return value


def _cost(section: Any) -> CostConfig:
    if not isinstance(section, Mapping):
        raise ConfigError(f"handler.cost: got {section!r}; allowed: a mapping")
    _reject_unknown("handler.cost", section, {f.name for f in fields(CostConfig)})
    values: dict[str, Any] = {}
    if "calibrate" in section:
        values["calibrate"] = _boolean("handler.cost.calibrate", section["calibrate"])
    for key, (low, high) in _COST_FLOATS.items():
        if key in section:
            values[key] = _number(f"handler.cost.{key}", section[key], low, high)
    return CostConfig(**values)
