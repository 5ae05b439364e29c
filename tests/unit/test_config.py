"""Config: defaults, the shipped model-configs, and errors naming the key, the value and the allowed range."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bucketing.config import STRATEGIES, ConfigError, CostConfig, HandlerConfig
from bucketing.settings_reference import markdown_table
from model_store import archives
from model_store.archives import ROOT


def test_defaults():
    config = HandlerConfig.from_yaml(None)
    assert (config.task, config.strategy, config.on_overflow) == ("embedding", "bucketed", "truncate")
    assert config.cost == CostConfig()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_shipped_model_configs_are_valid(strategy):
    raw = archives.model_config(strategy)
    config = HandlerConfig.from_yaml(raw)
    assert config.strategy == strategy
    assert raw["batchSize"] >= 1 and raw["minWorkers"] >= 1
    assert archives.model_config(strategy, threads=2)["handler"]["torch_threads"] == 2
    assert yaml.safe_load(archives.TEMPLATE.read_text())["handler"]["strategy"] == "bucketed"


def test_the_settings_reference_is_the_generated_one():
    page = (ROOT / "docs" / "configuration" / "settings.md").read_text()
    start = page.index("<!-- config-table")
    table = page[page.index("\n", start) + 1 : page.index("<!-- /config-table -->")]
    assert table == markdown_table(), "docs/configuration/settings.md's handler: table drifted: run make docs-settings"


def test_every_field_is_documented_and_validated():
    for name in ("task", "max_response_bytes", "torchscript", "cost"):
        with pytest.raises(ConfigError, match=f"handler.{name}"):
            HandlerConfig.from_mapping({name: object()})
    assert HandlerConfig().torchscript is True


@pytest.mark.parametrize("section", [[], "", 0, ["strategy"], "strategy: dynamic"])
def test_a_handler_section_that_is_not_a_mapping_is_refused(section):
    with pytest.raises(ConfigError, match="handler: expected a mapping"):
        HandlerConfig.from_yaml({"handler": section})


def test_absent_or_empty_handler_section_means_defaults():
    assert HandlerConfig.from_yaml({"batchSize": 4}) == HandlerConfig.from_yaml({"handler": None}) == HandlerConfig()
    with pytest.raises(ConfigError, match="model-config: expected a mapping"):
        HandlerConfig.from_yaml(["handler"])


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
        ({"truncate_dim": -1}, ["handler.truncate_dim", "-1", "from 0 to 65536"]),
        ({"truncate_dim": 64, "task": "sparse"}, ["handler.truncate_dim: got 64 for task sparse", "task embedding"]),
    ],
)
def test_errors_name_key_value_and_range(section, words):
    with pytest.raises(ConfigError) as err:
        HandlerConfig.from_mapping(section)
    for w in words:
        assert w in str(err.value)


def properties(path: Path) -> dict[str, str]:
    from tsctl import read_properties

    return read_properties(path)


def test_local_serving_config_is_loopback_with_auth_and_store_only_registration():
    props = properties(ROOT / "config" / "config.properties")
    for key in ("inference_address", "management_address", "metrics_address"):
        assert props[key].startswith("http://127.0.0.1:"), key
    assert props.get("disable_token_authorization", "false") == "false"
    assert props["enable_model_api"] == "true" and props["metrics_mode"] == "prometheus"
    assert props["allowed_urls"] == "file:///nonexistent/.*"
    assert int(props["job_queue_size"]) > 0 and props["install_py_dep_per_model"] == "false"


def test_every_shipped_config_keeps_metrics_on_loopback():
    """TorchServe 0.12 checks no token on /metrics: no config of ours may open it beyond the machine (or pod)."""
    shipped = sorted((ROOT / "config").rglob("*.properties"))
    assert len(shipped) >= 2
    for path in shipped:
        props = properties(path)
        assert props["metrics_address"].startswith("http://127.0.0.1:"), path
        assert props.get("enable_envvars_config", "false") == "false", path  # no TS_METRICS_* from the environment


def test_archive_template_states_no_handler_default():
    """The template sets only what differs from the handler's defaults: a default has one home, the schema."""
    handler = yaml.safe_load(archives.TEMPLATE.read_text())["handler"]
    defaults = HandlerConfig()
    restated = sorted(k for k, v in handler.items() if k != "strategy" and getattr(defaults, k) == v)
    assert restated == [], f"config/minilm.yaml restates handler defaults: {restated}"


def test_each_strategy_schedule_and_task_name_is_declared_once():
    from typing import get_args

    from bucketing.config import SCHEDULE_RULES, SCHEDULES, STRATEGIES, STRATEGY_RULES, TASKS
    from bucketing.model_kinds import KindName

    assert STRATEGIES == tuple(STRATEGY_RULES) == ("bucketed", "dynamic", "static")
    assert SCHEDULES == tuple(SCHEDULE_RULES) == ("batch", "continuous")
    assert TASKS == get_args(KindName)
    assert [n for n, s in STRATEGY_RULES.items() if s.budgeted] == ["bucketed"]
    assert [n for n, s in STRATEGY_RULES.items() if s.pads_to_max_length] == ["static"]
    assert [n for n, s in SCHEDULE_RULES.items() if s.pools] == ["continuous"]
    assert HandlerConfig.from_mapping({"strategy": "static", "schedule": "continuous"}).planning.pads_to_max_length
    assert HandlerConfig().scheduling == SCHEDULE_RULES["batch"] and HandlerConfig().planning.budgeted
