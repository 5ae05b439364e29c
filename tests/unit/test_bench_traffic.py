"""bench.inputs.traffic: the user's texts files (.txt, .jsonl, .csv), sampling, one-line errors."""

from __future__ import annotations

import json

import pytest

from bench.inputs import traffic

# --- --texts ---------------------------------------------------------------------------------------------------


def test_txt_is_one_text_a_line_blank_lines_dropped():
    data = b"first text\r\n\nsecond one\n   \nthird\n"
    assert traffic.parse_texts(data, "t.txt") == ["first text", "second one", "third"]


def test_txt_with_byte_order_mark():
    assert traffic.parse_texts("\ufeffhello\n".encode(), "t.txt") == ["hello"]


def test_jsonl_field_and_errors():
    data = b'{"text": "a b"}\n\n{"text": "c", "id": 2}\n'
    assert traffic.parse_texts(data, "t.jsonl") == ["a b", "c"]
    assert traffic.parse_texts(b'{"body": "x"}\n', "t.jsonl", field="body") == ["x"]
    with pytest.raises(traffic.TextsError, match=r"t.jsonl: line 2 has no field 'text' \(it has: body\)"):
        traffic.parse_texts(b'{"text": "x"}\n{"body": "y"}\n', "t.jsonl")
    with pytest.raises(traffic.TextsError, match="line 1 is not JSON"):
        traffic.parse_texts(b"{nope\n", "t.jsonl")
    with pytest.raises(traffic.TextsError, match="line 1: 'text' is int, not a string"):
        traffic.parse_texts(b'{"text": 3}\n', "t.jsonl")


def test_csv_column_and_errors():
    data = b'id,body\n1,"hello, world"\n2,"two\nlines"\n'
    assert traffic.parse_texts(data, "t.csv", field="body") == ["hello, world", "two\nlines"]
    with pytest.raises(traffic.TextsError, match=r"no column 'text' \(columns: id, body\); use --text-field"):
        traffic.parse_texts(data, "t.csv")


def test_undecodable_line_is_named():
    with pytest.raises(traffic.TextsError, match="t.txt: line 2 is not UTF-8"):
        traffic.parse_texts(b"ok\n\xff\xfe bad\n", "t.txt")


def test_empty_unknown_and_missing_files(tmp_path):
    with pytest.raises(traffic.TextsError, match="no texts"):
        traffic.parse_texts(b"\n  \n", "t.txt")
    with pytest.raises(traffic.TextsError, match="unknown format '.parquet'"):
        traffic.parse_texts(b"x", "t.parquet")
    with pytest.raises(traffic.TextsError, match="no such file"):
        traffic.load_texts(tmp_path / "missing.txt")
    with pytest.raises(traffic.TextsError, match="is a folder"):
        traffic.load_texts(tmp_path)


def test_sample_is_seeded_without_replacement(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"text {i}"}) + "\n" for i in range(50)))
    w = traffic.load_texts(path, sample=10, seed=1)
    assert w.name == "file:t.jsonl" and len(w.texts) == 10 == len(set(w.texts))
    assert w.texts == traffic.load_texts(path, sample=10, seed=1).texts
    assert w.texts != traffic.load_texts(path, sample=10, seed=2).texts
    assert len(traffic.load_texts(path, sample=500).texts) == 50  # more than there are: all of them
    with pytest.raises(traffic.TextsError, match="--sample: got 0"):
        traffic.load_texts(path, sample=0)


def test_every_error_is_one_line(tmp_path):
    cases = [(b"\xff\n", "a.txt"), (b'{"x": 1}\n', "a.jsonl"), (b"a,b\n1,2\n", "a.csv"), (b"", "a.txt")]
    for data, name in cases:
        with pytest.raises(traffic.TextsError) as e:
            traffic.parse_texts(data, name)
        assert "\n" not in str(e.value)
