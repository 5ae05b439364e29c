"""bench.peers: the registry of peer kinds, their command lines, bodies, layouts and dtypes, the peer configurations
of a plan, the refusals of `--peer-dtypes`, and the litserve server script's wiring (against a stand-in `litserve`
module: no peer venv is installed here). Pure: nothing is started."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import peers
from bench.harness import report, stats
from bench.inputs.configuration import Configuration

BASE = Configuration("bucketed", 16, duration=8)
NATIVE = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
EMULATED = "flags\t\t: fpu avx2\n"
SETUP = peers.PeerSetup(batch_size=16, dtype="bfloat16", workers=2, threads=1, batch_delay_ms=10)


def summary(config: Configuration) -> stats.Summary:
    return stats.summarize(config, [(50.0, 200, 10)] * 100, 10.0, stats.HandlerDelta(batches=1), 0.1, 5.0)


def test_the_registry_holds_typed_kinds_by_name():
    assert set(peers.PEERS) == {"infinity", "litserve"}
    for name, kind in peers.PEERS.items():
        assert isinstance(kind, peers.PeerKind) and kind.name == name
        assert kind.dtypes == ("float32", "bfloat16") and kind.health_route == "/health"
        for stage in kind.stages:  # each stage is a file, torch first (the local CPU wheel is the one kept)
            assert (peers.REQUIREMENTS / stage).is_file()
        assert "torch==2.13.0" in (peers.REQUIREMENTS / kind.stages[0]).read_text()
    assert isinstance(peers.PEERS["infinity"], peers.Infinity)
    assert isinstance(peers.PEERS["litserve"], peers.LitServe)


def test_litserve_pins_an_exact_litserve_and_our_sentence_transformers():
    pins = (peers.REQUIREMENTS / peers.PEERS["litserve"].stages[-1]).read_text()
    assert "litserve==0.2.19" in pins and "sentence-transformers==6.2.0" in pins
    ours = (Path(__file__).parents[2] / "requirements.txt").read_text()
    transformers = next(ln for ln in ours.splitlines() if ln.startswith("transformers=="))
    assert transformers in pins.splitlines()  # the model code our handler runs


def test_the_peer_flag_offers_every_kind():
    from bench import compare

    assert compare.parse_args(["--peer", "litserve"]).peer == "litserve"
    with pytest.raises(SystemExit):
        compare.parse_args(["--peer", "nope"])


def test_infinity_command_line_carries_batch_size_dtype_and_port():
    python = Path("/venvs/infinity/bin/python")
    cmd = peers.PEERS["infinity"].command(python, Path("/models/minilm"), 8123, SETUP)
    assert cmd[:2] == ["/venvs/infinity/bin/infinity_emb", "v2"]
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert flags["--model-id"] == "/models/minilm" and flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"
    assert flags["--batch-size"] == "16" and flags["--dtype"] == "bfloat16"
    assert flags["--engine"] == "torch" and flags["--device"] == "cpu"
    float32 = peers.PEERS["infinity"].command(python, Path("/m"), 1, replace(SETUP, dtype="float32"))
    assert float32[float32.index("--dtype") + 1] == "float32"
    assert peers.PEERS["infinity"].env()["INFINITY_ANONYMOUS_USAGE_STATS"] == "0"


def test_litserve_command_line_runs_our_server_script_with_the_venvs_python():
    python = Path("/venvs/litserve/bin/python")
    cmd = peers.PEERS["litserve"].command(python, Path("/models/minilm"), 8123, SETUP)
    assert cmd[0] == str(python) and Path(cmd[1]) == peers.SERVERS / "litserve_server.py"
    assert Path(cmd[1]).is_file()
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert flags == {
        "--model-dir": "/models/minilm",
        "--port": "8123",
        "--batch-size": "16",
        "--batch-timeout": "0.01",
        "--workers": "2",
        "--threads": "1",
        "--dtype": "bfloat16",
        "--timeout": "120",
        "--api-servers": "1",
    }


def test_bodies_routes_and_answers_are_openai_style():
    for kind in peers.PEERS.values():
        assert json.loads(kind.body("a text")) == {"model": "minilm", "input": "a text"}
        assert kind.embedding({"data": [{"index": 0, "embedding": [1, 0.5]}]}) == [1.0, 0.5]
    assert peers.PEERS["infinity"].route == "/embeddings"  # --url-prefix ""
    assert peers.PEERS["litserve"].route == "/v1/embeddings"  # OpenAIEmbeddingSpec's


def test_a_server_posts_to_its_kinds_route(tmp_path):
    server = peers.PeerServer(peers.PEERS["litserve"], Path("python"), tmp_path, SETUP, tmp_path)
    assert server.url == f"http://127.0.0.1:{server.port}/v1/embeddings" and server.engine == "torch"
    assert server.log_path.name == "litserve-bs16-bfloat16.log"


def test_dtypes_a_kind_refuses_in_one_line():
    kind = peers.PEERS["litserve"]
    assert kind.refused("float32", EMULATED) is None and kind.refused("bfloat16", NATIVE) is None
    refusal = kind.refused("bfloat16", EMULATED)
    assert refusal is not None and refusal.startswith("--peer-dtypes bfloat16: this CPU has no native bfloat16")
    assert "\n" not in refusal
    assert kind.refused("float16", NATIVE) == "--peer-dtypes float16: litserve runs float32, bfloat16"


def test_peer_configurations_follow_our_dtypes_unless_given():
    configs = [BASE, replace(BASE, strategy="dynamic"), replace(BASE, dtype="bfloat16", engine="torch")]
    lit = peers.peer_configs(configs, "litserve")
    assert [(c.name, c.dtype, c.workers, c.threads) for c in lit] == [
        ("litserve bs16", None, 2, 1),  # our layout: 2 workers x 1 thread
        ("litserve bs16 bfloat16", "bfloat16", 2, 1),
    ]
    assert all(c.peer == "litserve" and c.engine is None and c.schedule is None for c in lit)
    only_bf16 = peers.peer_configs(configs[:2], "litserve", ["bfloat16"])
    assert [c.name for c in only_bf16] == ["litserve bs16 bfloat16"]
    both = peers.peer_configs(configs[:1], "infinity", ["float32", "bfloat16"])
    cores = os.cpu_count() or 1
    assert [(c.name, c.workers, c.threads) for c in both] == [
        (f"infinity bs16 1x{cores}", 1, cores),
        (f"infinity bs16 1x{cores} bfloat16", 1, cores),
    ]


def test_a_setup_is_what_one_start_of_a_peer_is_given():
    config = peers.PEERS["litserve"].config(replace(BASE, max_batch_delay=5), "bfloat16")
    assert peers.PeerSetup.of(config) == peers.PeerSetup(16, "bfloat16", 2, 1, 5)
    assert peers.PeerSetup.of(peers.PEERS["litserve"].config(BASE, "float32")).dtype == "float32"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peer-dtypes", "bfloat16"], r"^--peer-dtypes: needs --peer$"),
        (["--peer", "litserve", "--peer-dtypes", "float16"], r"^--peer-dtypes float16: litserve runs float32, bf"),
        (["--peer", "litserve", "--peer-dtypes", "float32,bfloat16"], r"^--peer-dtypes bfloat16: this CPU has no"),
        (["--peer", "infinity", "--dtypes", "bfloat16"], r"^--dtypes bfloat16: this CPU has no native bfloat16"),
    ],
)
def test_peer_dtype_flag_errors_are_one_line(argv, message, monkeypatch):
    import bucketing.engines.precision
    from bench import compare

    monkeypatch.setattr(bucketing.engines.precision, "cpu_info", lambda: EMULATED)
    args = compare.parse_args(["--strategies", "bucketed", "--batch-sizes", "16", *argv])
    with pytest.raises(SystemExit, match=message):
        compare.check_args(args, compare.plan_from_args(args))


def test_peer_dtypes_pass_on_a_native_bf16_cpu(monkeypatch):
    import bucketing.engines.precision
    from bench import compare

    monkeypatch.setattr(bucketing.engines.precision, "cpu_info", lambda: NATIVE)
    args = compare.parse_args(["--strategies", "bucketed", "--peer", "litserve", "--peer-dtypes", "float32,bfloat16"])
    assert args.peer_dtype_list == ["float32", "bfloat16"]
    assert compare.check_args(args, compare.plan_from_args(args)) is None


def test_help_documents_the_peer_dtypes(capsys):
    from bench import compare

    with pytest.raises(SystemExit):
        compare.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--peer {infinity,litserve}" in out
    assert "--peer-dtypes PEER_DTYPES comma list of float32,bfloat16: the peer's precision" in out


def test_a_peer_is_compared_with_ours_at_its_own_dtype_only():
    ours32, ours16 = summary(BASE), summary(replace(BASE, dtype="bfloat16", engine="torch"))
    lit32, lit16 = (summary(c) for c in peers.peer_configs([BASE], "litserve", ["float32", "bfloat16"]))
    pairs = {(c.a.config.name, c.b.config.name) for c in stats.comparisons([ours32, ours16, lit32, lit16])}
    assert ("bucketed bs16", "litserve bs16") in pairs
    assert ("bucketed bs16 torch bfloat16", "litserve bs16 bfloat16") in pairs
    assert ("bucketed bs16", "litserve bs16 bfloat16") not in pairs
    assert ("bucketed bs16 torch bfloat16", "litserve bs16") not in pairs


def test_a_peer_row_carries_its_dtype_and_cosine():
    lit16 = replace(summary(peers.PEERS["litserve"].config(BASE, "bfloat16")), min_cosine=0.99991)
    row = lit16.row()
    assert row["dtype"] == "bfloat16" and row["min_cosine"] == 0.99991 and row["server"] == "litserve"
    assert summary(peers.PEERS["litserve"].config(BASE, "float32")).row()["dtype"] == "float32"
    table = report.results_table([summary(BASE), lit16])
    header, _, ours, theirs = table.splitlines()
    assert "| dtype |" in header and "| min_cosine |" in header
    assert "| float32 |" in ours and "| bfloat16 |" in theirs and "0.99991" in theirs
    assert report.layout(lit16.config) == "2 processes x 1 thread"


# --- the litserve server script, against a stand-in litserve module ----------------------------------------------


class _LitAPI:
    def __init__(self, max_batch_size: int = 1, batch_timeout: float = 0.0, spec: Any = None) -> None:
        self.max_batch_size, self.batch_timeout, self.spec = max_batch_size, batch_timeout, spec


class _LitServer:
    def __init__(self, api: Any, **kwargs: Any) -> None:
        self.api, self.kwargs = api, kwargs


@pytest.fixture
def litserve_server(monkeypatch):
    """The server script imported with a stand-in `litserve` (LitAPI, LitServer and OpenAIEmbeddingSpec)."""
    fake = types.ModuleType("litserve")
    fake.LitAPI = _LitAPI  # type: ignore[attr-defined]
    fake.LitServer = _LitServer  # type: ignore[attr-defined]
    fake.OpenAIEmbeddingSpec = type("OpenAIEmbeddingSpec", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "litserve", fake)
    spec = importlib.util.spec_from_file_location("litserve_server_under_test", peers.SERVERS / "litserve_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_builds_the_server_the_command_line_asks_for(litserve_server):
    cmd = peers.PEERS["litserve"].command(Path("python"), Path("/models/minilm"), 8123, SETUP)
    server = litserve_server.server(litserve_server.parse(cmd[2:]))
    assert server.kwargs == {"accelerator": "cpu", "workers_per_device": 2, "timeout": 120.0}
    api = server.api
    assert (api.max_batch_size, api.batch_timeout) == (16, 0.01)
    assert type(api.spec).__name__ == "OpenAIEmbeddingSpec"
    assert (api.model_dir, api.dtype, api.threads) == ("/models/minilm", "bfloat16", 1)


def test_the_scripts_worker_encodes_in_the_dtype_asked(litserve_server):
    import numpy as np
    import torch

    from bench.inputs import models

    folder = str(models.model_dir(None))
    threads = torch.get_num_threads()
    try:
        out = {}
        for dtype in ("float32", "bfloat16"):
            api = litserve_server.Encoder(folder, dtype, 1, 16, 0.01)
            api.setup("cpu")
            assert next(api.model.parameters()).dtype == getattr(torch, dtype) and torch.get_num_threads() == 1
            out[dtype] = api.predict(["a short text", "a somewhat longer text about batching and padding"])
            assert out[dtype].shape == (2, 384) and out[dtype].dtype == np.float32
            assert api.predict("one text alone").shape == (1, 384)  # a batch of one request: its text alone
    finally:
        torch.set_num_threads(threads)
    a, b = out["float32"], out["bfloat16"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert 0.99 < cos.min() < 1.0  # bfloat16 moves the answers a little
