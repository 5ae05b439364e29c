"""bench.harness.worker_memory: the peak RSS of a TorchServe's workers, read from /proc (a literal one here)."""

from __future__ import annotations

from bench.harness.worker_memory import vm_hwm_kb, workers_peak_rss_mb


def test_vm_hwm_is_read_from_a_status_text():
    assert vm_hwm_kb("Name:\tpython\nVmPeak:\t 900 kB\nVmHWM:\t  204800 kB\nVmRSS:\t 1000 kB\n") == 204800
    assert vm_hwm_kb("Name:\tkthreadd\n") is None


def test_only_the_workers_of_the_group_count(tmp_path):
    def proc(pid: int, pgid: int, cmdline: bytes, hwm_kb: int | None) -> None:
        folder = tmp_path / str(pid)
        folder.mkdir()
        (folder / "stat").write_text(f"{pid} (py) S 1 {pgid} {pgid} 0")
        (folder / "cmdline").write_bytes(cmdline)
        (folder / "status").write_text("Name:\tpy\n" + (f"VmHWM:\t{hwm_kb} kB\n" if hwm_kb else ""))

    worker = b"python\0/ts/model_service_worker.py\0--sock-type\0unix"
    proc(10, 7, b"java\0org.pytorch.serve.ModelServer", 4096 * 1024)  # the frontend: not a worker
    proc(11, 7, worker, 512 * 1024)
    proc(12, 7, worker, 768 * 1024)
    proc(13, 99, worker, 2048 * 1024)  # another server's worker
    proc(14, 7, worker, None)  # exited meanwhile: no VmHWM line
    (tmp_path / "self").mkdir()
    assert workers_peak_rss_mb(7, tmp_path) == 768.0
    assert workers_peak_rss_mb(8, tmp_path) is None
