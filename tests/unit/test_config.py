"""Config: defaults, the shipped model-configs, and errors naming the key, the value and the allowed range."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bucketing.config import ConfigError, CostConfig, HandlerConfig

ROOT = Path(__file__).resolve().parents[2]


def test_defaults():
    config = HandlerConfig.from_yaml(None)
    assert (config.task, config.strategy, config.on_overflow) == ("embedding", "bucketed", "truncate")
    assert config.cost == CostConfig()


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
def test_shipped_model_configs_are_valid(strategy):
    raw = yaml.safe_load((ROOT / "config" / f"minilm-{strategy}.yaml").read_text())
    config = HandlerConfig.from_yaml(raw)
    assert config.strategy == strategy
    assert raw["batchSize"] >= 1 and raw["minWorkers"] >= 1


def test_values_are_read():
    config = HandlerConfig.from_mapping(
        {"task": "classification", "max_length": 128, "on_overflow": "reject", "cost": {"calibrate": False}}
    )
    assert (config.task, config.max_length, config.on_overflow, config.cost.calibrate) == (
        "classification",
        128,
        "reject",
        False,
    )


@pytest.mark.parametrize(
    "section, words",
    [
        ({"strategy": "sorted"}, ["handler.strategy", "'sorted'", "bucketed | dynamic | static"]),
        ({"task": 3}, ["handler.task", "embedding | classification"]),
        ({"max_length": 0}, ["handler.max_length", "got 0", "from 1 to 8192"]),
        ({"max_length": "128"}, ["handler.max_length", "'128'", "integer"]),
        ({"max_length": True}, ["handler.max_length", "True"]),
        ({"torch_threads": 1000}, ["handler.torch_threads", "1000", "from 1 to 256"]),
        ({"on_overflow": "drop"}, ["handler.on_overflow", "truncate | reject"]),
        ({"normalize": "yes"}, ["handler.normalize", "true | false"]),
        ({"max_batch_tokens": 100}, ["handler.max_batch_tokens", "got 100", "at least", "256"]),
        ({"max_length": 250, "pad_to_multiple_of": 64, "max_batch_tokens": 255}, ["(256)"]),
        ({"batch": 3}, ["handler: unknown key(s) batch", "allowed:", "max_length"]),
        ({"cost": {"overhead": 1}}, ["handler.cost: unknown key(s) overhead", "forward_overhead_us"]),
        ({"cost": {"per_token_us": -1}}, ["handler.cost.per_token_us", "-1", "from 0"]),
        ({"cost": {"calibrate": "no"}}, ["handler.cost.calibrate", "true | false"]),
        ({"cost": 5}, ["handler.cost", "mapping"]),
    ],
)
def test_errors_name_key_value_and_range(section, words):
    with pytest.raises(ConfigError) as err:
        HandlerConfig.from_mapping(section)
    for w in words:
        assert w in str(err.value)


def test_handler_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match="handler: expected a mapping"):
        HandlerConfig.from_yaml({"handler": ["strategy"]})


def properties(path: Path) -> dict[str, str]:
    from bench.server import read_properties

    return read_properties(path)


def test_local_serving_config_is_loopback_with_auth_and_store_only_registration():
    props = properties(ROOT / "config" / "config.properties")
    for key in ("inference_address", "management_address", "metrics_address"):
        assert props[key].startswith("http://127.0.0.1:"), key
    assert props.get("disable_token_authorization", "false") == "false"
    assert props["enable_model_api"] == "true" and props["metrics_mode"] == "prometheus"
    assert props["allowed_urls"] == "file:///nonexistent/.*"
    assert int(props["job_queue_size"]) > 0 and props["install_py_dep_per_model"] == "false"


def test_kserve_config_keeps_management_and_metrics_on_loopback():
    props = properties(ROOT / "config" / "kserve" / "config.properties")
    assert props["management_address"].startswith("http://127.0.0.1:")
    assert props["metrics_address"].startswith("http://127.0.0.1:")
    assert props.get("disable_token_authorization", "false") == "false" and props["enable_model_api"] == "false"
    assert "service_envelope" not in props  # the handler speaks v2 itself, with batching on
