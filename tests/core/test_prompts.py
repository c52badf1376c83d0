"""Prompts files: clear refusals for a file that is not UTF-8 and for repeated ids (results pair by id)."""

from __future__ import annotations

import pytest

from app.core.errors import SetupError
from app.core.prompts import Prompt, list_suites, load_jsonl, load_suite


def test_reads_ids_categories_and_default_ids(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "one", "category": "qa"}\n\n{"prompt": "two"}\n', encoding="utf-8")
    assert load_jsonl(f) == [Prompt("a", "one", "qa"), Prompt("p3", "two", "")]


def test_a_file_that_is_not_utf8_names_the_byte_offset_and_the_fix(tmp_path):
    f = tmp_path / "latin1.jsonl"
    first = '{"id": "a", "prompt": "plain"}\n'
    f.write_bytes(first.encode() + '{"id": "b", "prompt": "café"}\n'.encode("latin-1"))
    offset = len(first.encode()) + len('{"id": "b", "prompt": "caf')
    with pytest.raises(SetupError) as e:
        load_jsonl(f)
    assert e.value.message == f"prompts file {f} is not UTF-8: byte 0xe9 at offset {offset} (line 2) is not valid UTF-8"
    assert "save the file as UTF-8" in e.value.fix


def test_utf16_is_named(tmp_path):
    f = tmp_path / "notepad.jsonl"
    f.write_bytes('{"prompt": "hi"}\n'.encode("utf-16"))  # with its byte-order mark, as Notepad's "Unicode" writes it
    with pytest.raises(SetupError, match="offset 0 .*looks like UTF-16"):
        load_jsonl(f)


def test_utf8_with_a_byte_order_mark_and_line_separators_inside_strings(tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + '{"id": "x", "prompt": "a\u2028b"}\n{"id": "y", "prompt": "c"}\n'.encode())
    assert load_jsonl(f) == [Prompt("x", "a\u2028b"), Prompt("y", "c")]
    bad = tmp_path / "bom-bad.jsonl"
    bad.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "\xff"}\n')
    with pytest.raises(SetupError, match="byte 0xff at offset 15 "):  # 3 (the mark) + 12: offsets count the mark
        load_jsonl(bad)


def test_duplicate_ids_are_refused_naming_the_id_and_both_lines(tmp_path):
    f = tmp_path / "dup.jsonl"
    f.write_text('{"id": "q1", "prompt": "a"}\n{"id": "q2", "prompt": "b"}\n\n{"id": "q1", "prompt": "c"}\n', encoding="utf-8")
    with pytest.raises(SetupError) as e:
        load_jsonl(f)
    assert e.value.message == f"{f}: prompt id 'q1' appears on line 1 and line 4; ids must be unique (results are paired by id)"
    assert e.value.fix == "give the prompt on line 4 another id"


def test_a_default_id_that_collides_with_a_given_one_is_refused(tmp_path):
    f = tmp_path / "dup2.jsonl"
    f.write_text('{"id": "p2", "prompt": "a"}\n{"prompt": "b"}\n', encoding="utf-8")  # line 2 gets the default id p2
    with pytest.raises(SetupError, match="prompt id 'p2' appears on line 1 and line 2"):
        load_jsonl(f)


def test_malformed_and_missing_files_are_setup_errors(tmp_path):
    with pytest.raises(SetupError, match="cannot read prompts file"):
        load_jsonl(tmp_path / "nope.jsonl")
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a"}\n', encoding="utf-8")
    with pytest.raises(SetupError, match=r"bad.jsonl:1: not a prompt line"):
        load_jsonl(f)


def test_shipped_suites_load_with_unique_ids():
    for name in list_suites():
        ids = [p.id for p in load_suite(name)]
        assert len(ids) == len(set(ids)), name


def test_bench_refuses_a_bad_prompts_file_before_starting_a_worker(tmp_path, monkeypatch, capsys):
    import app.worker.client as client
    from app.commands import main

    def no_worker(*a, **kw):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(client, "WorkerClient", no_worker)
    f = tmp_path / "dup.jsonl"
    f.write_text('{"id": "q", "prompt": "a"}\n{"id": "q", "prompt": "b"}\n', encoding="utf-8")
    assert main(["bench", "--target", "smollm2-135m-instruct", "--prompts", str(f)]) == 2
    err = capsys.readouterr().err
    assert "prompt id 'q' appears on line 1 and line 2" in err and "fix: give the prompt on line 2 another id" in err
