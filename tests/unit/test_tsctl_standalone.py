"""tsctl's standalone server control: a pid file is trusted only for a process whose identity was checked."""

from __future__ import annotations

import os

from tsctl.standalone import Standalone, is_our_standalone


def test_a_pid_file_naming_another_process_is_removed_never_signalled(tmp_path):
    server = Standalone(tmp_path, 1)
    server.pid_file.write_text(f"{os.getpid()} 1\n")  # this very test process: alive, but not our server
    assert not is_our_standalone(os.getpid(), tmp_path) and server.pid() is None
    said = server.clear_stale()
    assert said is not None and "nothing signalled" in said and not server.pid_file.exists()
    server.pid_file.write_text("1 1\n")  # init
    assert server.stop() is None and not server.pid_file.exists()  # stopped nothing, and said so by None


def test_no_pid_file_is_no_server_and_no_key(tmp_path):
    server = Standalone(tmp_path, 1)
    assert server.pid() is None and server.key() is None and server.clear_stale() is None
