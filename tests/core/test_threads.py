"""SPECDECK_THREADS: every engine's CPU threads, in this process and in the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.threads import ENV, cpu_threads

ROOT = Path(__file__).resolve().parents[2]


def test_unset_means_one_per_core_and_a_bad_value_says_what_to_set(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert cpu_threads() is None
    monkeypatch.setenv(ENV, " 3 ")
    assert cpu_threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=rf"{ENV}='{bad}': set it to a whole number of CPU threads per engine, at least 1"):
            cpu_threads()


def test_import_app_caps_torch_here_and_in_the_processes_it_starts():
    code = ("import app, torch, subprocess, sys\n"
            "from app.engines.llamacpp import physical_cores\n"
            "child = subprocess.run([sys.executable, '-c', 'import torch; print(torch.get_num_threads())'], capture_output=True, text=True)\n"
            "print(torch.get_num_threads(), physical_cores(), child.stdout.strip())\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={**env, ENV: "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "1"]  # torch here, llama.cpp's default n_threads, torch in a child (a worker)


def test_a_bad_value_stops_the_command_with_the_fix():
    r = subprocess.run([sys.executable, "-m", "app", "engines"], capture_output=True, text=True, cwd=ROOT, env={**os.environ, ENV: "lots"}, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == f"specdeck: {ENV}='lots': set it to a whole number of CPU threads per engine, at least 1 (or unset it: one per core)"
