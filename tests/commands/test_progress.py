"""Progress in a log is a line per phase and per 10 %, not carriage-return frames; sizes in whole MiB."""

from __future__ import annotations

import io

from app.commands.progress import ProgressBars


def test_a_log_gets_a_line_per_ten_percent_and_whole_mib():
    out = io.StringIO()  # not a terminal
    bars = ProgressBars(stream=out, settle_s=0)
    total = 1065.5601196289062
    for i in range(0, 1066 * 8, 8):  # the join + verify loop reports every 8 MiB chunk
        bars("join + verify", min(i / 8 * 1.0, total), total, "MiB")
    bars("join + verify", total, total, "MiB")
    bars.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    assert lines[0] == "join + verify… (1,066 MiB)"
    assert [ln.split(":")[1].split("(")[0].strip() for ln in lines[1:-1]] == [f"{p}%" for p in range(10, 100, 10)]
    assert lines[1] == "join + verify: 10% (107 of 1,066 MiB)"  # whole MiB, never 8.0/1065.5601196289062
    assert lines[-1].startswith("join + verify: done, 1,066 MiB in ")
    assert len(lines) == 11


def test_tasks_without_a_total_say_when_they_started_and_ended_and_quiet_prints_nothing():
    out = io.StringIO()
    bars = ProgressBars(stream=out, settle_s=0)
    bars("load weights", 0, 0)
    bars("load weights", 5, 0)
    bars("bench", 0, 4, "lanes")
    bars("bench", 1, 4, "lanes", note="ngram p0: 21.3 tok/s")
    bars.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "load weights…"
    assert lines[1] == "bench… (4 lanes)"
    assert lines[2] == "bench: 20% (1 of 4 lanes) — ngram p0: 21.3 tok/s"  # 25 % crosses the 20 % line
    assert lines[3].startswith("load weights: done in ") and lines[4].startswith("bench: stopped at 20% after ")
    quiet = io.StringIO()
    q = ProgressBars(quiet=True, stream=quiet)
    q("x", 1, 2)
    q.close()
    assert quiet.getvalue() == ""


def test_a_terminal_gets_a_bar_that_is_removed_when_done():
    out = io.StringIO()
    bars = ProgressBars(stream=out, tty=True)
    bars("dequantise", 3, 10, "tensors")
    assert "dequantise" in out.getvalue() and "3/10" in out.getvalue()
    bars("dequantise", 10, 10, "tensors")
    assert bars.bars == {}


def test_a_task_that_ends_within_a_second_prints_its_start_and_end_only():
    out = io.StringIO()
    bars = ProgressBars(stream=out)
    for i in range(273):
        bars("load smollm2: weights", i, 272)
    assert out.getvalue().splitlines()[0] == "load smollm2: weights… (272)"
    assert len(out.getvalue().splitlines()) == 2 and "done" in out.getvalue().splitlines()[1]


def test_lanes_failing_the_same_way_are_said_once():
    from app.commands.bench import error_lines
    from app.core.events import RunError

    gone = "engine srv: cannot reach http://127.0.0.1:9 (connection refused)\n  fix: is the server running? Check base_url in s.toml"
    errors = [RunError(f"p{i}#0/L2", gone, kind="ServerUnreachable") for i in range(19)] + [RunError("p0#0/L3", "other"), RunError(None, "whole")]
    lines = error_lines(errors)
    assert lines[0].startswith("error in 19 lanes (p0#0/L2, p1#0/L2, p2#0/L2, p3#0/L2 and 15 more): engine srv: cannot reach")
    assert lines[1:] == ["error in lane p0#0/L3: other", "error: whole"]
