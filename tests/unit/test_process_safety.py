"""A stale pid file is reported and removed, never acted on: the process it names survives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tsctl import TorchServe
from tsctl.identity import is_our_server


@pytest.fixture
def bystander():
    """A live process that is not TorchServe (what a reused pid points at after a crash or a reboot)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def stale_server(tmp_path, pid: int) -> TorchServe:
    server = TorchServe(tmp_path / "serve")
    server.tmp.mkdir(parents=True)
    server.pid_file.write_text(f"{pid}\n")
    return server


@pytest.mark.parametrize("pid", ["bystander", "self", 1])
def test_stop_never_signals_what_a_stale_pid_file_names(tmp_path, bystander, pid):
    target = {"bystander": bystander.pid, "self": os.getpid()}.get(pid, pid)
    server = stale_server(tmp_path, target)
    assert server.pid() is None and not is_our_server(target, server.workdir)
    server.stop(timeout=1)
    assert bystander.poll() is None, "the unrelated process was signalled"
    assert not server.pid_file.exists()


def test_cli_reports_and_removes_a_stale_pid_file(tmp_path, bystander):
    server = stale_server(tmp_path, bystander.pid)
    for command in ("status", "stop"):
        server.pid_file.write_text(f"{bystander.pid}\n")
        out = subprocess.run(
            [sys.executable, "-m", "tsctl", command, "--workdir", str(server.workdir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"stale pid file {server.pid_file} named pid {bystander.pid} (sleep 300)" in out
        assert "nothing signalled" in out and not server.pid_file.exists()
    assert bystander.poll() is None
    token = subprocess.run(
        [sys.executable, "-m", "tsctl", "token", "--workdir", str(server.workdir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert token.returncode == 1 and "make serve" in token.stderr


def tsctl(command: str, workdir, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tsctl", command, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


POSER = "exec -a java python3 -c 'import time; time.sleep(300)' org.pytorch.serve.ModelServer -f "


@pytest.fixture
def impostors(tmp_path):
    """Processes in the server's folder that name TorchServe's main class without being TorchServe: a shell loop
    running pgrep for it, a bystander in that loop's group, and `sleep` posing as java (argv[0] and arguments)."""
    workdir = tmp_path / "serve"
    workdir.mkdir()
    conf = workdir / "config.properties"
    loop = subprocess.Popen(
        ["bash", "-c", "sleep 300 & while true; do pgrep -f org.pytorch.serve.ModelServer >/dev/null; sleep 0.2; done"],
        cwd=workdir,
        start_new_session=True,
    )
    poser = subprocess.Popen(["bash", "-c", POSER + str(conf)], cwd=workdir, start_new_session=True)
    yield workdir, [loop, poser]
    for proc in (loop, poser):
        os.killpg(proc.pid, 9)
        proc.wait()


def bystanders(pgid: int) -> set[int]:
    """The long-lived members of a process group: those running `sleep 300` (the loop's own `pgrep` and `sleep 0.2`
    come and go, so counting all members would race with them)."""
    from tsctl.identity import argv, stat_fields

    pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    members = {pid for pid in pids if (f := stat_fields(pid)) and int(f[2]) == pgid and f[0] != "Z"}
    return {pid for pid in members if argv(pid) == ["sleep", "300"]}


def test_stop_without_a_pid_file_signals_nothing_that_only_names_torchserve(impostors):
    workdir, procs = impostors
    loop = procs[0]
    deadline = time.monotonic() + 5
    while not bystanders(loop.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    held = bystanders(loop.pid)
    assert held, "the bystander never started"
    out = tsctl("stop", workdir)
    assert out.returncode == 0 and "TorchServe was not running." in out.stdout, out
    assert all(p.poll() is None for p in procs), "a process that only names TorchServe was signalled"
    assert bystanders(loop.pid) == held  # the bystander in the loop's group too


def test_a_fifo_as_pid_file_is_one_line_not_a_hang(tmp_path):
    server = TorchServe(tmp_path / "serve")
    server.tmp.mkdir(parents=True)
    os.mkfifo(server.pid_file)
    for command in ("stop", "status", "start"):
        out = tsctl(command, server.workdir, timeout=20)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out
        assert f"error: {server.pid_file} is not a regular file (mode p" in out.stderr


def test_a_folder_as_pid_file_is_one_line_not_a_traceback(tmp_path):
    server = TorchServe(tmp_path / "serve")
    server.pid_file.mkdir(parents=True)
    out = tsctl("stop", server.workdir)
    assert (
        out.returncode == 1
        and out.stderr
        == f"error: {server.pid_file} is a folder, not a pid file: remove it (`rm -r {server.pid_file}`) and retry\n"
    )


@pytest.mark.parametrize("name", ["config.properties", "torchserve.out", "logs", "tmp", "tmp/.model_server.pid"])
def test_start_writes_nothing_through_a_symlink(tmp_path, name):
    server = TorchServe(tmp_path / "serve")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim"
    target.write_text("keep me\n")
    link = server.workdir / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target if "." in name.rsplit("/", 1)[-1] else outside)
    out = tsctl("start", server.workdir)
    assert out.returncode == 1 and f"error: {link} is a symlink" in out.stderr and out.stderr.count("\n") == 1, out
    assert target.read_text() == "keep me\n" and sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_a_launched_process_not_yet_recognisable_is_waited_for_not_taken_for_gone(tmp_path, monkeypatch):
    """The pid file names a live process in our folder that shows TorchServe's command line only later (a JVM
    mid-start under load): start's wait and stop both wait for it to settle instead of calling it gone (which left
    a server running)."""
    import tsctl.process as process

    server = TorchServe(tmp_path / "serve")
    server.tmp.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "300"], cwd=server.workdir)
    try:
        server.pid_file.write_text(f"{proc.pid}\n")
        assert server.launched() == proc.pid and server.pid() is None
        calls = {"n": 0}

        def recognised_on_third_look(pid, workdir, config_file=None):
            calls["n"] += 1
            return pid == proc.pid and calls["n"] >= 3

        monkeypatch.setattr(process, "is_our_server", recognised_on_third_look)
        monkeypatch.setattr(process, "find_servers", lambda workdir, config_file=None: [])
        assert server.settled_pid(wait_s=5.0) == proc.pid
        monkeypatch.setattr(process, "is_our_server", lambda *a, **k: False)
        t0 = time.monotonic()
        assert server.settled_pid(wait_s=0.3) is None and time.monotonic() - t0 < 2.0  # bounded
    finally:
        proc.kill()
        proc.wait()
    assert server.launched() is None  # gone: nothing to wait for
