"""`train-drafter` refuses what would delete outside its folder, a folder it cannot write and nonsense budgets —
before loading the model (each case one error line and its fix); Ctrl-C while gathering keeps the data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _train(*args: str, heads: Path | str) -> subprocess.CompletedProcess:
    """`python -m app train-drafter` as a user runs it (a process of its own)."""
    env = {**os.environ, "SPECDECK_HEADS": str(heads)}
    return subprocess.run([sys.executable, "-m", "app", "train-drafter", "--target", "smollm2-135m-instruct", *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.fixture
def train_here(monkeypatch, capsys):
    """The same command through `app.commands.main` in this process (refusals need no process of their own: each
    subprocess would spend seconds importing torch before refusing). Returns (exit code, stderr)."""
    from app.commands import main

    def run(*args: str, heads: Path | str) -> tuple[int, str]:
        monkeypatch.setenv("SPECDECK_HEADS", str(heads))
        capsys.readouterr()
        rc = main(["train-drafter", "--target", "smollm2-135m-instruct", *args])
        return rc, capsys.readouterr().err

    return run


@pytest.mark.parametrize("name", ["..", "../elsewhere", "/tmp/x", "a/b", ".hidden", ""])
def test_a_head_name_that_is_a_path_deletes_nothing(tmp_path, name, train_here):
    heads = tmp_path / "heads"
    heads.mkdir()
    keep = tmp_path / "elsewhere"
    keep.mkdir()
    (keep / "precious.txt").write_text("keep me")
    (heads / "other").mkdir()
    if name == "..":  # one case as a user runs it
        r = _train("--name", name, "--fresh", "--minutes", "0.1", heads=heads)
        rc, err = r.returncode, r.stderr
    else:
        rc, err = train_here("--name", name, "--fresh", "--minutes", "0.1", heads=heads)
    assert rc == 2 and f"head name {name!r} is not a plain name" in err and "Traceback" not in err, err
    assert (keep / "precious.txt").read_text() == "keep me" and (heads / "other").is_dir()


def test_an_unwritable_heads_folder_is_said_before_the_model_loads(train_here):
    rc, err = train_here("--name", "h", "--minutes", "0.1", heads="/proc/specdeck-heads")
    assert rc == 2 and "cannot write the trained head to /proc/specdeck-heads" in err
    assert "SPECDECK_HEADS" in err and "Traceback" not in err


@pytest.mark.parametrize("args, says", [
    (("--minutes", "nan"), "--minutes must be a number of minutes in (0, 1440], got nan"),
    (("--minutes", "inf"), "--minutes must be a number of minutes in (0, 1440], got inf"),
    (("--depth", "0"), "--depth must be in [1, 16]"),
    (("--vocab", "-5"), "--vocab must be in [16, 1048576]"),
    (("--data-share", "nan"), "--data-share must be in [0.1, 0.9], got nan"),
])
def test_nonsense_budgets_are_refused_before_the_model_loads(tmp_path, args, says, train_here):
    rc, err = train_here("--name", "h", *args, heads=tmp_path)
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert not (tmp_path / "h").exists()


def test_an_interrupted_gathering_keeps_what_it_gathered(tiny_pair, tmp_path):
    """The gatherer writes its features when interrupted (KeyboardInterrupt inside the loop, as Ctrl-C raises it)."""
    import json

    from app.engines.hf import HFEngine
    from app.engines.registry import resolve
    from app.speculative import redrafter_training as td

    engine = HFEngine(resolve(str(tiny_pair[0])))
    calls = [0]
    real = td._generate_batch

    def interrupted(*a, **kw):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    td._generate_batch = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            td.gather(engine, tmp_path / "work", float("inf"), [], 0, td._Say(True))
    finally:
        td._generate_batch = real
    state = json.loads((tmp_path / "work" / "data.json").read_text())
    assert state["positions"] > 0 and sum(k.startswith("held:") for k in state["done"]) > 0  # what came before the interrupt
    train, held = td.load_features(tmp_path / "work")
    assert sum(len(d["ids"]) for d in train + held) == state["positions"]
