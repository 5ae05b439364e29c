"""Peers: the venv's failure is one clear line, and a peer's whole process group is stopped however a run ends."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import peers
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
class FakeSpec(peers.PeerSpec):
    script: str = ""

    def command(self, python: Path, model_dir: Path, port: int, batch_size: int) -> list[str]:
        return [sys.executable, self.script, str(port)]


def test_a_venv_that_cannot_be_installed_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "REQUIREMENTS", tmp_path)
    (tmp_path / "bad.txt").write_text("this-package-does-not-exist-anywhere==0.0.1\n")
    spec = peers.PeerSpec("nope", ("bad.txt",))
    with pytest.raises(peers.PeerUnavailable, match=r"nope: installing bad.txt failed: ") as e:
        peers.venv(spec, root=tmp_path / "venvs", progress=False)
    assert "\n" not in str(e.value)


def test_peer_server_lifecycle_and_group_stop(tmp_path):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE)
    spec = FakeSpec("fake", (), script=str(script))
    with peers.PeerServer(spec, Path(sys.executable), tmp_path, 16, tmp_path / "logs") as server:
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
    spec = FakeSpec("fake", (), script=str(script))
    server = peers.PeerServer(spec, Path(sys.executable), tmp_path, 16, tmp_path / "logs")
    calls = []

    def health(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 3:  # the peer is up by then, with its child: interrupted while waiting for /health
            raise interrupt()
        raise OSError("not yet")

    monkeypatch.setattr(peers.urllib.request, "urlopen", health)
    with pytest.raises(interrupt):
        with server:
            pytest.fail("__enter__ must not return")
    assert server.proc is not None, "the peer was started"
    assert processes_under(script) == [] and not group_alive(server.proc.pid)


def test_a_peer_that_exits_at_start_says_why(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text("import sys; print('cannot load the model: no such folder'); sys.exit(3)")
    spec = FakeSpec("fake", (), script=str(script))
    with pytest.raises(peers.PeerUnavailable, match="fake exited with 3: cannot load the model: no such folder"):
        peers.PeerServer(spec, Path(sys.executable), tmp_path, 16, tmp_path / "logs").start()


def test_cosine():
    assert peers.cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert peers.cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
