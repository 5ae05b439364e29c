"""Peers: the venv's failure is one clear line, and a peer's whole process group is stopped however a run ends; the
litserve kind's own command line runs its server script (against a stand-in `litserve` module, so no peer venv is
installed) and answers what our float32 reference answers, in float32 and in bfloat16."""

from __future__ import annotations

import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import peers
from bench.inputs import models
from bench.inputs.references import cosine
from bench.peers import kind as peer_kind
from tests.e2e.conftest import processes_under
from tsctl.identity import group_alive

pytestmark = pytest.mark.e2e

FAKE = """
import http.server, json, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child, as servers have
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps({"data": [{"embedding": [1.0, float(len(body["input"]))]}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@dataclass(frozen=True)
class FakeKind(peers.PeerKind):
    """A peer kind whose server is the fake above (the route and health route are the kind's defaults)."""

    script: str = ""

    def command(self, python: Path, model_dir: Path, port: int, setup: peers.PeerSetup) -> list[str]:
        return [sys.executable, self.script, str(port)]


SETUP = peers.PeerSetup(16)


def test_a_venv_that_cannot_be_installed_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_kind, "REQUIREMENTS", tmp_path)
    (tmp_path / "bad.txt").write_text("this-package-does-not-exist-anywhere==0.0.1\n")
    spec = FakeKind("nope", ("bad.txt",))
    with pytest.raises(peers.PeerUnavailable, match=r"nope: installing bad.txt failed: ") as e:
        peers.venv(spec, root=tmp_path / "venvs", progress=False)
    assert "\n" not in str(e.value)


def test_peer_server_lifecycle_and_group_stop(tmp_path):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE)
    spec = FakeKind("fake", (), script=str(script))
    with peers.PeerServer(spec, Path(sys.executable), tmp_path, SETUP, tmp_path / "logs") as server:
        assert server.embed(["ab", "abcd"]) == [[1.0, 2.0], [1.0, 4.0]]
        assert len(processes_under(script)) == 1 and server.cpu() is not None
        assert server.proc is not None
        pgid = server.proc.pid
    assert processes_under(script) == []
    assert not group_alive(pgid)  # the child it started is gone too (zombies count as gone)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])  # Ctrl-C; SIGTERM under exit_on_signals
def test_an_interrupt_while_the_peer_starts_ends_its_whole_group(tmp_path, monkeypatch, interrupt):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE)
    spec = FakeKind("fake", (), script=str(script))
    server = peers.PeerServer(spec, Path(sys.executable), tmp_path, SETUP, tmp_path / "logs")
    calls = []

    def health(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 3:  # the peer is up by then, with its child: interrupted while waiting for /health
            raise interrupt()
        raise OSError("not yet")

    monkeypatch.setattr(urllib.request, "urlopen", health)
    with pytest.raises(interrupt):
        with server:
            pytest.fail("__enter__ must not return")
    assert server.proc is not None, "the peer was started"
    assert processes_under(script) == [] and not group_alive(server.proc.pid)


def test_a_peer_that_exits_at_start_says_why(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text("import sys; print('cannot load the model: no such folder'); sys.exit(3)")
    spec = FakeKind("fake", (), script=str(script))
    with pytest.raises(peers.PeerUnavailable, match="fake exited with 3: cannot load the model: no such folder"):
        peers.PeerServer(spec, Path(sys.executable), tmp_path, SETUP, tmp_path / "logs").start()


def test_cosine():
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)


STAND_IN_LITSERVE = """
\"\"\"A stand-in for litserve: the surface litserve_server.py uses, served by http.server in one process (a batch is
one request), with as many idle child processes as workers, as LitServe has.\"\"\"
import http.server, json, subprocess, sys

class OpenAIEmbeddingSpec:
    pass

class LitAPI:
    def __init__(self, max_batch_size=1, batch_timeout=0.0, spec=None):
        self.max_batch_size, self.batch_timeout, self.spec = max_batch_size, batch_timeout, spec

class LitServer:
    def __init__(self, api, accelerator="auto", workers_per_device=1, timeout=30):
        assert accelerator == "cpu" and isinstance(api.spec, OpenAIEmbeddingSpec)
        self.api, self.workers = api, workers_per_device

    def run(self, host, port, num_api_servers=None, log_level="info", generate_client_file=True):
        assert host == "127.0.0.1" and not generate_client_file
        for _ in range(self.workers):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", self.api.model_dir])
        self.api.setup("cpu")
        api = self.api
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404); self.end_headers()
            def do_POST(self):
                assert self.path == "/v1/embeddings"
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rows = api.predict([body["input"]])
                data = [{"index": 0, "object": "embedding", "embedding": [float(x) for x in rows[0]]}]
                out = json.dumps({"data": data, "model": body["model"], "object": "list"}).encode()
                self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
                self.wfile.write(out)
            def log_message(self, *a): pass
        http.server.HTTPServer((host, port), H).serve_forever()
"""
SPOT_TEXTS = [
    "Short text.",
    "How do I reset my password if I no longer have access to my email account?",
    "A transformer encoder maps a sequence of tokens to a sequence of vectors, one per token; pooling then turns "
    "them into one vector per text, and a dense layer may project it to fewer dimensions before normalisation.",
]


@pytest.mark.parametrize("dtype, lowest, highest", [("float32", 0.99999, 1.000001), ("bfloat16", 0.99, 0.999999)])
def test_litserve_runs_its_server_script_and_answers_as_our_reference(tmp_path, monkeypatch, dtype, lowest, highest):
    stand_in = tmp_path / "stand_in" / "litserve"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text(STAND_IN_LITSERVE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(stand_in.parent), os.environ.get("PYTHONPATH", "")]))
    model = tmp_path / "minilm"  # our MiniLM, under a path the test's processes can be found by
    model.symlink_to(models.model_dir(None))
    kind = peers.PEERS["litserve"]
    setup = peers.PeerSetup(4, dtype, workers=2, threads=1)
    # this test's python has torch and sentence-transformers (our requirements), as the peer's venv does
    with peers.PeerServer(kind, Path(sys.executable), model, setup, tmp_path / "logs") as server:
        assert server.url.endswith("/v1/embeddings")
        assert len(processes_under(model)) == 3  # the server and its two workers
        cosine = peers.spot_check(server, SPOT_TEXTS, model)
        assert lowest < cosine < highest, cosine  # bfloat16 moves the answers a little, float32 not at all
        assert server.proc is not None
        pgid = server.proc.pid
    assert processes_under(model) == [] and not group_alive(pgid)
