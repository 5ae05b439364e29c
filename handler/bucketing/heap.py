"""Give a worker's freed heap back to the OS after a pass that left it resident (glibc's `malloc_trim`): torch
allocates a pass's tensors through glibc's heap, which kept the pages a long request's passes freed, so a torch
worker's peak grew with the request (788 MB at 512 texts, 1,814 MB at 4,096) rather than staying what one pass of
`max_batch_tokens` needs. A trim runs only once the process's resident memory has grown by `GROWTH_BYTES` since the
last one (a pass of short rows pays nothing; a trim costs a few ms, a pass that grew it by that much hundreds). A
no-op where the C library has no `malloc_trim` (not glibc) or there is no /proc."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

GROWTH_BYTES = 64 << 20  # resident memory a worker may gain before a pass's end gives the heap's free pages back
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> Any:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.restype, trim.argtypes = ctypes.c_int, [ctypes.c_size_t]
    return trim


_TRIM = _malloc_trim()
_after_trim = 0  # resident bytes right after the last trim (shared by a process's workers: a race only trims twice)


def resident_bytes() -> int | None:
    """This process's resident memory now (None without /proc)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def release(growth: int = GROWTH_BYTES) -> bool:
    """After a pass: give the heap's free pages back when resident memory grew by more than `growth` bytes since
    the last trim; whether it trimmed."""
    global _after_trim
    if _TRIM is None:
        return False
    now = resident_bytes()
    if now is None or now - _after_trim <= growth:
        return False
    _TRIM(0)
    _after_trim = resident_bytes() or now
    return True


__all__ = ["GROWTH_BYTES", "release", "resident_bytes"]
