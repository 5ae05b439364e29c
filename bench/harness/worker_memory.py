"""The peak RSS of a running TorchServe's workers, or of one process (the standalone server, whose workers are its
threads), read from /proc (the compare bench's `Memory:` line)."""

from __future__ import annotations

from pathlib import Path

WORKER = b"model_service_worker"  # in the command line of each TorchServe Python worker


def vm_hwm_kb(status: str) -> int | None:
    """The peak resident set size (`VmHWM`, kB) in a /proc/PID/status text; None when absent."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def workers_peak_rss_mb(pgid: int, proc: Path = Path("/proc")) -> float | None:
    """The largest peak RSS (MB) of the TorchServe workers alive in process group `pgid`; None: no worker read."""
    peaks = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            if WORKER not in (entry / "cmdline").read_bytes():
                continue
            peak = vm_hwm_kb((entry / "status").read_text())
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if peak is not None:
            peaks.append(peak / 1024)
    return max(peaks) if peaks else None


def process_peak_rss_mb(pid: int, proc: Path = Path("/proc")) -> float | None:
    """The peak RSS (MB) of one process; None: gone, or not read."""
    try:
        peak = vm_hwm_kb((proc / str(pid) / "status").read_text())
    except OSError:
        return None
    return peak / 1024 if peak is not None else None
