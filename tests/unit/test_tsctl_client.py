"""tsctl pieces that need no server: properties, key file reading and expiry, free ports."""

from __future__ import annotations

import datetime as dt
import json
import socket

from tsctl import Endpoints, KeyFile, free_ports, port_in_use, read_properties


def test_read_properties_skips_comments_and_keeps_equals_in_values(tmp_path):
    path = tmp_path / "config.properties"
    path.write_text('# comment\ninference_address=http://127.0.0.1:1\n\nmodel_snapshot={"a":"b=c"}\n')
    assert read_properties(path) == {"inference_address": "http://127.0.0.1:1", "model_snapshot": '{"a":"b=c"}'}


def test_key_file_is_reread_when_it_changes_and_knows_expiry(tmp_path):
    path = tmp_path / "key_file.json"
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")
    path.write_text(json.dumps({"inference": {"key": "abc", "expiration time": soon}, "API": {"key": "api"}}))
    keys = KeyFile(path)
    assert keys.headers("inference") == {"Authorization": "Bearer abc"}
    assert 200 < keys.seconds_left("inference") <= 301
    assert keys.seconds_left("API") == float("inf")
    path.write_text(json.dumps({"inference": {"key": "renewed"}}))
    keys.reload()
    assert keys.key("inference") == "renewed"
    assert KeyFile(tmp_path / "missing.json").headers("inference") == {}
    half_written = tmp_path / "half.json"
    half_written.write_text("")
    half = KeyFile(half_written)
    assert half.key("inference") is None  # TorchServe still writing: no key yet, read again next time
    half_written.write_text(json.dumps({"inference": {"key": "k"}}))
    assert half.key("inference") == "k"
    assert KeyFile(None).seconds_left("inference") == float("inf")


def test_free_ports_are_distinct_and_a_bound_port_is_seen_in_use():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    e = Endpoints.on_ports(*ports)
    assert e.inference == f"http://127.0.0.1:{ports[0]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
        s.listen()
        assert port_in_use(e.inference)
    assert not port_in_use(e.metrics)
