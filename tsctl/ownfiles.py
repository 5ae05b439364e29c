"""The server folder's own files: read small ones without blocking, write without ever following a symlink."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from .client import ServerError


def read_small_file(path: Path, limit: int, what: str) -> str | None:
    """A small regular file's text (None if absent), read without following a symlink and without blocking: a
    FIFO, a folder, a device, a symlink or a file over `limit` bytes is a ServerError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        kind = "a symlink" if path.is_symlink() else "a folder" if path.is_dir() else e.strerror
        raise ServerError(f"{path} is {kind}, not a {what}: remove it (`rm -r {path}`) and retry") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else f"not a regular file (mode {stat.filemode(info.st_mode)})"
        raise ServerError(f"{path} is {kind}, not a {what}: remove it (`rm -r {path}`) and retry")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ServerError(f"{path} holds over {limit} bytes, not a {what}: remove it and retry")
    return data.decode(errors="replace")


def refuse_symlinks(folder: Path, names: Sequence[str]) -> None:
    """A ServerError if any of `names` in `folder` is a symlink (TorchServe or we would write through it)."""
    for name in names:
        if (folder / name).is_symlink():
            raise ServerError(
                f"{folder / name} is a symlink; the server's folder must hold its own files, not "
                "links out of it: remove it and retry"
            )


def open_own(path: Path, flags: int) -> int:
    """A file descriptor for writing a file of the server's own folder, never through a symlink."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
    except OSError as e:
        raise ServerError(
            f"cannot write {path} ({e.strerror}); it must be a regular file of the server's folder, not a symlink"
        ) from None


def write_own(path: Path, data: bytes) -> None:
    with os.fdopen(open_own(path, os.O_TRUNC), "wb") as f:
        f.write(data)
