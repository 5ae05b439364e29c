"""`bucketing.heap`: a trim only once resident memory grew past its bound since the last, and a real trim gives
freed heap pages back (glibc)."""

from __future__ import annotations

import pytest

from bucketing import heap


def test_a_trim_runs_only_once_resident_memory_grew_past_the_bound(monkeypatch):
    trims: list[int] = []
    resident = iter([100, 40, 70, 200, 90])  # bytes, as the calls below read them (before, and after a trim)

    def trim(pad: int) -> int:
        trims.append(pad)
        return 1

    monkeypatch.setattr(heap, "_TRIM", trim)
    monkeypatch.setattr(heap, "resident_bytes", lambda: next(resident))
    monkeypatch.setattr(heap, "_after_trim", 0)
    assert heap.release(growth=64)  # 100, grown by 100 since 0: trimmed, 40 left
    assert not heap.release(growth=64)  # 70: grown by 30 since the trim
    assert heap.release(growth=64)  # 200: grown by 160: trimmed, 90 left
    assert trims == [0, 0] and heap._after_trim == 90


def test_no_trim_without_growth_or_without_glibc(monkeypatch):
    monkeypatch.setattr(heap, "_after_trim", 1000)
    monkeypatch.setattr(heap, "resident_bytes", lambda: 1050)
    monkeypatch.setattr(heap, "_TRIM", lambda pad: pytest.fail("trimmed"))
    assert not heap.release(growth=64)
    monkeypatch.setattr(heap, "_TRIM", None)
    monkeypatch.setattr(heap, "resident_bytes", lambda: 10**12)
    assert not heap.release(growth=64)


@pytest.mark.skipif(heap._TRIM is None or heap.resident_bytes() is None, reason="needs glibc and /proc")
def test_a_real_trim_gives_freed_heap_pages_back():
    """200 MB in heap chunks (below glibc's mmap threshold), every other one freed: resident until the trim."""
    chunks = [bytearray(100_000) for _ in range(2000)]
    for c in chunks:
        c[::4096] = b"x" * len(c[::4096])  # touched: resident
    del chunks[::2]
    before = heap.resident_bytes()
    assert before is not None
    assert heap.release(growth=0)
    after = heap.resident_bytes()
    assert after is not None and before - after > 50 << 20, (before, after)
    del chunks
