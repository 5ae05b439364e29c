"""bench.probes.outputs: a BGE-M3 folder built from MiniLM answers every set of outputs in both formats through the
handler, and the table says what each costs against dense alone (bytes are exact; speed is never asserted)."""

from __future__ import annotations

from bench.probes import outputs


def test_every_set_of_outputs_is_answered_and_tabled(capsys):
    assert outputs.main(["--requests", "2", "--rounds", "1", "--repeat", "1", "--workload", "short"]) == 0
    rows = [
        line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms" not in line
    ]
    assert len(rows) == len(outputs.FORMATS) * len(outputs.OUTPUT_SETS)
    size = {(r[0].strip("| "), r[1]): int(r[6].strip(" |").replace(",", "")) for r in rows}
    for fmt in ("ours, JSON", "KServe v2, binary"):
        assert size[(fmt, "colbert")] > 3 * size[(fmt, "dense")]  # a vector a token against one a text
        assert size[(fmt, "dense + sparse + colbert")] > size[(fmt, "colbert")]
        assert [r[5] for r in rows if r[0].strip("| ") == fmt][0] == "1.000"  # dense against itself
