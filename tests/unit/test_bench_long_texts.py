"""bench.probes.long_texts: its documents (token counts spread evenly) and its table's cells."""

from __future__ import annotations

from bench.probes.long_texts import Row, documents


def test_documents_are_spread_evenly_and_reproducible():
    docs = documents(3, 100, 300)
    assert docs == documents(3, 100, 300) and len(docs) == 3
    assert len(docs[0].split()) < len(docs[1].split()) < len(docs[2].split())


def test_row_cells_against_the_baseline():
    row = Row("chunk", seconds=2.0, docs=4, tokens=8000, passes=5, vectors=4)
    assert row.cells(baseline=0.5) == ["chunk", "2.00", "2,000", "5", "4", "4.00x"]
