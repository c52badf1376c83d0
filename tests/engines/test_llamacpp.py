"""llama.cpp engines (backend = "llamacpp"): SmolLM2's packaged Q4_1 GGUF run as it is by llama-cpp-python, for
real (no mock): loading, llama.cpp's own tokenizer against the HF one, the decode state the loop drives (logits
only where asked, crop, one KV cache per lane), the loop's lanes on it, a draft across backends, and bad input.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
import torch

from app.core.errors import EngineError
from app.core.events import LaneDone, RunError, StepEvent
from app.core.setups import Sampling
from app.engines.manifest import EngineManifest
from app.engines.registry import load_manifest, resolve

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by `make` (pyproject dependency)")

from app.engines.llamacpp import LlamaCppDecodeState, LlamaCppEngine, load_gguf_tokenizer  # noqa: E402

LC_SMOL = "llamacpp-smollm2-135m-instruct"
PROMPT = "Rename the variable x to total in: def f(x):\n    return x * 2 + x\n"
LONG = ("Complete this Python function that checks whether a string is a palindrome, ignoring case and "
        "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n")


@pytest.fixture(scope="module")
def eng() -> LlamaCppEngine:
    return LlamaCppEngine(resolve(LC_SMOL))


def test_loads_the_gguf_as_it_is(eng):
    """Seconds to load, the GGUF's quantisation as dtype, its own file (no fp32 copy), SmolLM2's vocabulary."""
    t0 = time.perf_counter()
    e = LlamaCppEngine(resolve(LC_SMOL))
    assert time.perf_counter() - t0 < 10
    assert (e.backend, e.device, e.dtype, e.vocab_size) == ("llamacpp", "cpu", "Q4_1", 49152)
    assert e.gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and e.context_length == 4096
    assert 2 in e.eos_ids  # <|im_end|>


@pytest.mark.skipif(os.environ.get("LLAMA_AMX") == "on", reason="built with LLAMA_AMX=on: ggml's AMX kernels kept")
def test_the_build_leaves_out_ggml_amx_kernels_and_a_batched_decode_runs(eng):
    """`make` compiles llama.cpp without ggml's AMX kernels (Makefile, LLAMA_AMX): on a Sapphire Rapids VM here every
    batched decode of a Q4 model died with SIGILL inside them (this test's decode of 86 tokens included, checked with
    the old library). On any CPU the build's feature line must not name them, and the decode must run."""
    features = llama_cpp.llama_print_system_info().decode()
    assert features.startswith("CPU :")  # ggml's CPU backend and the features it was compiled with
    assert "AMX" not in features, f"llama.cpp was built with AMX kernels: {features}"
    st = eng.new_state()
    ids = eng.encode_prompt(LONG * 2, chat=False)
    assert len(ids) >= 32  # wide enough for ggml's tiled (AMX) path: 2 x 16 rows
    logits = st.forward(ids)
    assert logits.shape == (len(ids), eng.vocab_size) and torch.isfinite(logits).all()


def test_gguf_tokenizer_matches_the_hf_one(eng, smollm2_tokenizer):
    """llama.cpp's tokenizer from the GGUF passes the cross-engine check against transformers' (same probe ids,
    same vocabulary) and the chat template from the GGUF gives the same prompt ids as transformers'."""
    from app.engines.base import PROBE_TEXT, check_tokenizers

    tok = load_gguf_tokenizer(resolve(LC_SMOL))  # vocab-only: no weights
    check_tokenizers("smollm2-135m-instruct", smollm2_tokenizer, LC_SMOL, tok)
    assert tok.encode(PROBE_TEXT, add_special_tokens=False) == smollm2_tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    hf = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True)
    hf = list(hf["input_ids"] if not isinstance(hf, list) else hf)
    assert eng.encode_prompt(PROMPT, chat=True) == hf
    assert eng.decode(hf[-5:]) == smollm2_tokenizer.decode(hf[-5:], skip_special_tokens=True)


def test_decode_state_logits_where_asked_and_crop(eng):
    """forward returns logits for the last `keep` positions only; crop rolls the KV cache back so the same tokens
    give the same logits again; two states (two lanes) do not share a cache."""
    ids = eng.encode_prompt(PROMPT)
    a = eng.new_state()
    assert isinstance(a, LlamaCppDecodeState)
    first = a.forward(ids, last_only=True)
    assert first.shape == (1, 49152) and first.dtype == torch.float32 and a.length == len(ids)
    nxt = [int(first.argmax())]
    for _ in range(4):
        nxt.append(int(a.forward([nxt[-1]], last_only=True)[0].argmax()))
    a.crop(len(ids) + 1)
    rows = a.forward(nxt[1:], keep=3)
    assert rows.shape == (3, 49152) and a.length == len(ids) + 5
    a.crop(len(ids) + 1)
    again = a.forward(nxt[1:], keep=3)
    assert torch.equal(rows, again)  # same tokens, same batch: the same logits after a crop
    b = eng.new_state()
    assert b.length == 0
    assert torch.equal(b.forward(ids, last_only=True), first)  # untouched by a's tokens
    with pytest.raises(ValueError):
        a.crop(a.length + 1)


def _lane(target, drafter, ids, max_new=32):
    from tests.helpers import run_lane

    evs = list(run_lane(target, drafter, ids, Sampling(max_new_tokens=max_new)))
    assert isinstance(evs[-1], LaneDone)
    return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats


def test_loop_lanes_on_llamacpp_and_the_verifier_is_exact_on_its_logits(eng, monkeypatch):
    """Baseline, n-gram and a self-draft on llama.cpp. The verifier is lossless given the logits it gets: every
    step's accepted drafts and target token are exactly what the recorded llama.cpp logits say (argmax). Against
    the baseline the outputs agree up to the first divergence, which batched-vs-single numerics may cause and the
    stats report (never hidden)."""
    from app.core.metrics import first_divergence
    from app.speculative.drafters import DraftModelDrafter, NGramDrafter

    ids = eng.encode_prompt(LONG)
    _, base = _lane(eng, None, ids)
    assert base.new_tokens == 32 and base.output_text.strip()
    seen: list[tuple[list[int], torch.Tensor]] = []
    real = LlamaCppDecodeState.forward

    def spy(self, toks, last_only=False, keep=0):
        out = real(self, toks, last_only=last_only, keep=keep)
        if self is spied[0]:
            seen.append((list(toks), out))
        return out

    spied: list = [None]
    real_new = LlamaCppEngine.new_state

    def new_state(self):
        st = real_new(self)
        if spied[0] is None:
            spied[0] = st  # the target's state (the loop creates it first)
        return st

    monkeypatch.setattr(LlamaCppDecodeState, "forward", spy)
    monkeypatch.setattr(LlamaCppEngine, "new_state", new_state)
    steps, st = _lane(eng, NGramDrafter(3, 6), ids)
    monkeypatch.undo()
    assert len(seen) == len(steps)  # one target forward per step
    for (fed, logits), e in zip(seen, steps, strict=True):
        greedy = logits.argmax(-1).tolist()
        a = e.accepted_count
        if e.drafted_ids:
            assert fed[len(fed) - len(e.drafted_ids):] == list(e.drafted_ids)  # the drafts went in with this forward
        assert list(e.drafted_ids[:a]) == greedy[:a]  # accepted exactly where the target agrees
        if e.target_id is not None:
            assert e.target_id == greedy[a]
    d = first_divergence(list(base.output_ids), list(st.output_ids))
    assert st.output_ids[: d if d is not None else None] == base.output_ids[: d if d is not None else None]
    _, self_draft = _lane(eng, DraftModelDrafter(eng, 4), ids)
    assert self_draft.drafted > 0 and self_draft.accepted / self_draft.drafted > 0.8


@pytest.mark.slow
def test_a_llamacpp_draft_serves_a_pytorch_target(tmp_path):
    """Across backends: SmolLM2 fp32 on PyTorch as the target, the same model's Q4_1 GGUF on llama.cpp as the
    draft, through the worker's scheduler (tokenizer check, then the lane)."""
    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    pool = EnginePool()
    spec = LaneSpec("L1", f"draft:{LC_SMOL},k=4", "p", LONG)
    evs = list(lane_events(pool, "smollm2-135m-instruct", spec, Sampling(max_new_tokens=24), chat=True, cancelled=lambda: False))
    done = evs[-1]
    assert isinstance(done, LaneDone), evs[-1]
    assert done.stats.new_tokens == 24 and done.stats.accepted / done.stats.drafted > 0.5


def _manifest_file(tmp_path: Path, body: str, name: str = "lc") -> EngineManifest:
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return load_manifest(p)


def test_parts_are_joined_once_into_the_cache(tmp_path, monkeypatch):
    """gguf_parts: joined once (sha256 checked) into the cache entry, then used from there without rereading."""
    from app.engines import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = cache.source_paths(resolve(LC_SMOL))[0].read_bytes()
    parts = []
    for i, chunk in enumerate((src[:40_000_000], src[40_000_000:70_000_000], src[70_000_000:])):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(chunk)
        parts.append(str(p))
    sha = hashlib.sha256(src).hexdigest()
    m = _manifest_file(tmp_path, f'backend = "llamacpp"\ndtype = "auto"\n[source]\ngguf_parts = {parts!r}\nsize = {len(src)}\nsha256 = "{sha}"\n'.replace("'", '"'))
    from app.engines.gguf_header import gguf_file_type

    assert gguf_file_type([Path(p) for p in parts]) == "Q4_1"  # the header read across the parts
    path = cache.prepare_gguf(m)
    assert path.name == "model.gguf" and path.stat().st_size == len(src) and path.parent.parent == tmp_path / "cache" / "specdeck"
    mtime = path.stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(cache, "_verify_stream", lambda *a, **k: calls.append(a))
    assert cache.prepare_gguf(m) == path and not calls and path.stat().st_mtime_ns == mtime
    e = LlamaCppEngine(m)
    assert e.dtype == "Q4_1" and e.gguf == path


def test_bad_input_is_one_clear_error(tmp_path, monkeypatch):
    """Unknown or bad [llamacpp] keys, a GPU device, a corrupt part (sha256), a lane past n_ctx, and a missing
    llama-cpp-python: each one EngineError naming the fix."""
    gguf = str(resolve(LC_SMOL).source[0])
    base = f'backend = "llamacpp"\n[source]\ngguf = "{gguf}"\n'
    with pytest.raises(EngineError, match="unknown key 'n_gpu' in \\[llamacpp\\]"):
        LlamaCppEngine(_manifest_file(tmp_path, base + "[llamacpp]\nn_gpu = 1\n"))
    with pytest.raises(EngineError, match=r"n_ctx must be >= 16 \(positions of a lane's context.*\), got 0"):
        LlamaCppEngine(_manifest_file(tmp_path, base + "[llamacpp]\nn_ctx = 0\n"))
    # every number bounded by what llama.cpp and the machine allow, naming the key: no 32-bit wrap, no OOM kill
    with pytest.raises(EngineError, match=r"\[llamacpp\] n_ctx must be <= 1048576 .*, got 100000000000"):
        _manifest_file(tmp_path, base + "[llamacpp]\nn_ctx = 100000000000\n")
    with pytest.raises(EngineError, match=rf"\[llamacpp\] n_threads must be <= {os.cpu_count()} \(CPU threads; this machine has"):
        _manifest_file(tmp_path, base + f"[llamacpp]\nn_threads = {(os.cpu_count() or 1) + 1}\n")
    with pytest.raises(EngineError, match=r"\[llamacpp\] n_batch must be <= 8192 \(tokens per llama_decode call\), got 1000000"):
        _manifest_file(tmp_path, base + "[llamacpp]\nn_batch = 1000000\n")
    with pytest.raises(EngineError, match=r"n_ctx = 100000 is more than the 8192 positions the model was trained for") as ei:
        LlamaCppEngine(_manifest_file(tmp_path, base + "[llamacpp]\nn_ctx = 100000\n"))  # SmolLM2 was trained on 8,192
    assert "set n_ctx to at most 8192" in str(ei.value)
    with pytest.raises(EngineError, match="run on the CPU in this build"):
        LlamaCppEngine(_manifest_file(tmp_path, base), device="cuda")
    with pytest.raises(EngineError, match="needs a GGUF source|exactly one of gguf, gguf_parts"):
        _manifest_file(tmp_path, 'backend = "llamacpp"\n[source]\nhf_dir = "x"\n')
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bad = _manifest_file(tmp_path, base.replace('[source]\n', '[source]\nsha256 = "' + "0" * 64 + '"\n'), name="bad")
    with pytest.raises(EngineError, match="sha256 of the weights"):
        LlamaCppEngine(bad)
    small = LlamaCppEngine(_manifest_file(tmp_path, base + "[llamacpp]\nn_ctx = 256\n", name="small"))
    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    pool = EnginePool()
    pool.put("small", small)
    evs = list(lane_events(pool, "small", LaneSpec("L", "baseline", "p", PROMPT), Sampling(max_new_tokens=240), chat=True, cancelled=lambda: False))
    assert isinstance(evs[-1], RunError) and "> the 256 positions of small" in evs[-1].message
    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda n, *a, **k: (_ for _ in ()).throw(ImportError(n)) if n == "llama_cpp" else real_import(n, *a, **k))
    with pytest.raises(EngineError, match="llama-cpp-python is not installed") as ei:
        LlamaCppEngine(_manifest_file(tmp_path, base, name="noimport"))
    assert "make" in str(ei.value)


def test_llamacpp_lookup_reference_lane(eng):
    """`llamacpp-lookup[:k=N]`: llama-cpp-python's own prompt lookup on the llama.cpp target, tokens only, through
    the scheduler; two such lanes interleaved each get their own Llama (one shared Llama once aborted the worker
    in llama.cpp's sampler); greedy output equals the plain llama.cpp baseline's up to any numerics divergence;
    on a PyTorch target it is refused with the fix."""
    from app.core.metrics import first_divergence
    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events, schedule

    pool = EnginePool()
    pool.put("lc", eng)
    prompt = "Rename the variable x to total everywhere:\nx = 0\nfor i in range(10):\n    x += i\n    print(x)\nreturn x\n"
    lanes = [LaneSpec(f"L{i}", s, "p", prompt, group="g") for i, s in enumerate(("baseline", "llamacpp-lookup:k=4", "llamacpp-lookup"))]
    out: list = []
    schedule(lanes, lambda spec: lane_events(pool, "lc", spec, Sampling(max_new_tokens=40), True, lambda: False), "interleaved", out.append)
    done = {e.lane_id: e.stats for e in out if isinstance(e, LaneDone)}
    assert set(done) == {"L0", "L1", "L2"}, [e for e in out if isinstance(e, RunError)]
    base = done["L0"]
    for lid in ("L1", "L2"):
        st = done[lid]
        assert st.library and st.drafted == 0 and st.new_tokens > 0
        d = first_divergence(list(base.output_ids), list(st.output_ids))
        assert st.output_ids[:d] == base.output_ids[:d] if d is not None else st.output_ids == base.output_ids
    steps = [e for e in out if isinstance(e, StepEvent) and e.lane_id == "L2"]
    assert all(e.target_kind == "library" for e in steps) and sum(len(e.emitted_ids) for e in steps) == done["L2"].new_tokens
    assert len(eng.lookup_pool) == 2  # one Llama per interleaved lane, returned for the next run
    from app.runners.llamacpp_lookup import LlamaLookupRunner

    class Hf:
        backend, name = "hf", "smollm2-135m-instruct"

    with pytest.raises(Exception, match="llama.cpp target"):
        LlamaLookupRunner(Hf())


def test_bench_puts_pytorch_and_llamacpp_lanes_side_by_side(tiny_pair, tmp_path):
    """`bench` with lanes moved to a llama.cpp target (`…@<engine>`): that target gets its own baseline (added
    automatically), each speedup is against its own target's baseline, the PyTorch baseline is the reference for
    first divergence, and the lanes say which engine, backend and precision ran them."""
    import json
    import subprocess
    import sys

    target, _ = tiny_pair
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(target), "--setup", f"ngram@{LC_SMOL}",
           "--setup", f"draft:{LC_SMOL},k=4@{LC_SMOL}", "--prompt", LONG, "--max-new-tokens", "24", "--mode", "interleaved",
           "--warmup", "0", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    setups = [x["setup"] for x in doc["summary"]]
    assert setups == ["baseline", f"baseline@{LC_SMOL}", f"ngram:n=3,k=8@{LC_SMOL}", f"draft:{LC_SMOL},k=4@{LC_SMOL}"]
    runs = {x["setup"]: x for x in doc["runs"]}
    lc_base = runs[f"baseline@{LC_SMOL}"]
    for s in setups[2:]:
        assert runs[s]["speedup"] == pytest.approx(lc_base["wall_s"] / runs[s]["wall_s"])
    assert doc["reference"] == "baseline" and lc_base["reference_divergence"] is not None  # a random tiny model vs SmolLM2
    assert "| ref" in r.stdout and f"baseline@{LC_SMOL}" in r.stdout
    assert f"loaded {LC_SMOL} on cpu (Q4_1)" in r.stderr


def test_memory_is_the_file_plus_a_kv_cache():
    """Loading reads the GGUF into memory once (no mapped copy beside llama.cpp's repacked one): the process grows
    by about the file's size after load, and by one lane's KV cache after a lane (measured in a fresh process)."""
    import json
    import subprocess
    import sys

    code = f"""
import json, psutil
from app.engines.registry import resolve
from app.engines.llamacpp import LlamaCppEngine
p = psutil.Process(); r0 = p.memory_info().rss
e = LlamaCppEngine(resolve({LC_SMOL!r})); r1 = p.memory_info().rss
s = e.new_state(); lg = s.forward(e.encode_prompt("hi"), last_only=True)
for _ in range(16):
    lg = s.forward([int(lg[0].argmax())], last_only=True)
r2 = p.memory_info().rss
print(json.dumps([e.gguf.stat().st_size, r1 - r0, r2 - r0]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    size, load, lane = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 2**20
    assert load < size + 80 * mib, f"load grew RSS by {load / mib:.0f} MiB for a {size / mib:.0f} MiB GGUF"
    assert lane < load + 200 * mib  # one lane: a 4096-position KV cache for a 30-layer 135M model and its buffers


def test_dropped_decode_states_free_their_context(eng):
    """llama-cpp-python's model keeps a reference to every context it made, so a lane's state must free its own:
    before the fix each state leaked its KV cache and logits buffer (Qwen 0.5B: ~54 MB a lane; a 24-prompt suite
    bench with four llama.cpp lanes ran the worker out of 24 GB)."""
    import psutil

    proc = psutil.Process()
    s = eng.new_state()
    s.forward([1, 2, 3], last_only=True)
    del s
    before = proc.memory_info().rss
    for _ in range(12):
        s = eng.new_state()
        s.forward([1, 2, 3], last_only=True)
        del s
    grown = (proc.memory_info().rss - before) / 2**20
    assert grown < 40, f"{grown:.0f} MiB kept by 12 dropped states"


# a token tree over the prompt's last token: parents as tree indices (-1: the root, i.e. that last token)
TREE_TOKS = [100, 200, 300, 400, 500, 600]
TREE_PARENTS = [-1, -1, 0, 0, 1, 2]  # 100 and 200 at the root; 300, 400 under 100; 500 under 200; 600 under 300


@pytest.fixture
def eng_f32kv(eng):
    """The engine with lanes on an f32 KV cache. Where a token's KV cells sit (a tree's kept path lies among freed
    cells; a branch's cells skip its siblings') changes the order of the attention sums; with llama.cpp's default
    f16 cache that moves a logit by up to ~0.8 here (a numerics difference the reports show as a first
    divergence), with f32 by less: a tighter check of the mask, the positions and the cache."""
    from llama_cpp import llama_context_params

    saved = llama_context_params.from_buffer_copy(eng.lane_params)
    eng.lane_params.type_k = eng.lane_params.type_v = 0  # GGML_TYPE_F32
    yield eng
    eng.lane_params = saved


def _plain(eng, chunks: list[tuple[list[int], int]]) -> torch.Tensor:
    """Rows of a plain sequence fed in `chunks` of (tokens, batch size): each chunk is padded to its batch size (the
    padding cropped after: causal, it changes no earlier row) so every row comes from the same kind of batch as
    the tree's. Returns the rows of the last chunk's tokens."""
    s = eng.new_state()
    out = None
    for toks, size in chunks:
        n = s.length
        out = s.forward(toks + [1] * (size - len(toks)))[: len(toks)]
        s.crop(n + len(toks))
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same logits up to llama.cpp's numerics: activations are quantised to 8 bits per row before each matmul of
    the Q4_1 weights, so an f32 rounding difference in the attention sum (cells in another order) can flip a
    rounding step and move a logit by ~0.2 here; attending to a wrong token moves it by ~10."""
    return float((a - b).abs().max()) < 1.0


def test_token_trees_through_sequence_ids(eng_f32kv):
    """llama.cpp takes no attention mask, so a tree goes in as sequence ids (one per branch, copied onto the shared
    ancestors' KV cells): every node's logits are those of a plain forward along its own root path (up to
    numerics, see _close; in one batch as the loop verifies or level by level as a tree drafter grows it), not
    those of a sibling's path; select keeps one path, which goes on like a plain sequence; crop inside a tree
    drops whole branches; bad trees are refused and leave the state as it was."""
    from app.engines.llamacpp import TREE_SEQS

    eng = eng_f32kv
    ids = eng.encode_prompt(LONG)
    pre, last = ids[:-1], ids[-1]
    L, n = len(pre), len(TREE_TOKS) + 1
    s = eng.new_state()
    s.forward(pre, last_only=True)
    out = s.forward_tree([last, *TREE_TOKS], [L - 1, *(L + 1 + p for p in TREE_PARENTS)])  # the loop's verify batch
    assert out.shape == (n, 49152) and s.length == L + n

    def path(i):  # tokens from `last` down to tree token i
        p = []
        while i >= 0:
            p.append(TREE_TOKS[i])
            i = TREE_PARENTS[i]
        return [last, *p[::-1]]

    assert torch.equal(out[0], _plain(eng, [(pre, len(pre)), ([last], n)])[0])
    for i in range(len(TREE_TOKS)):
        assert _close(out[1 + i], _plain(eng, [(pre, len(pre)), (path(i), n)])[-1]), i
    assert not _close(out[3], _plain(eng, [(pre, len(pre)), ([last, 200, 300], n)])[-1])  # a sibling's path: ~10 off
    # keep last -> 200 -> 500 (a branch with a sequence id of its own), then go on as a plain sequence
    s.select([*range(L), L, L + 2, L + 5])
    assert s.length == L + 3
    assert _close(s.forward([7, 8, 9]), _plain(eng, [(pre, len(pre)), ([last, 200, 500], n), ([7, 8, 9], 3)]))
    t = eng.new_state()
    t.forward(pre, last_only=True)
    t.forward_tree([100, 200, 300], [L - 1, L - 1, L])
    with pytest.raises(ValueError, match="not one path"):
        t.select([*range(L), L + 1, L + 2])  # 300 is under 100, not 200
    # level by level, as a tree drafter grows its tree; crop drops the newest nodes
    d = eng.new_state()
    d.forward(ids, last_only=True)
    n0, P = len(ids), (ids, len(ids))
    lv1 = d.forward_tree([11, 12, 13], [n0 - 1] * 3)
    lv2 = d.forward_tree([21, 22, 23], [n0, n0 + 1, n0 + 1])
    assert _close(lv1[2], _plain(eng, [P, ([13], 3)])[0])
    assert _close(lv2[2], _plain(eng, [P, ([12], 3), ([23], 3)])[0])
    d.crop(n0 + 4)  # drops 22 and 23 (22 opened a branch of its own)
    lv3 = d.forward_tree([31], [n0 + 1])
    assert _close(lv3[0], _plain(eng, [P, ([12], 3), ([31], 1)])[0])
    d.select([*range(n0), n0 + 1, n0 + 4])
    assert d.length == n0 + 2 and _close(d.forward([5]), _plain(eng, [P, ([12], 3), ([31], 1), ([5], 1)]))
    d.crop(3)
    assert d.length == 3
    # refused: a parent outside the tree, too many branches
    w = eng.new_state()
    w.forward(pre, last_only=True)
    with pytest.raises(ValueError, match="parent slot"):
        w.forward_tree([1, 2], [L - 2, L])
    with pytest.raises(EngineError, match="smaller tree"):
        w.forward_tree(list(range(TREE_SEQS + 1)), [L - 1] * (TREE_SEQS + 1))
    assert w.length == L and _close(w.forward([last]), _plain(eng, [(pre, len(pre)), ([last], 1)]))


def test_tree_lanes_on_llamacpp(eng, monkeypatch):
    """`tree:` lanes with llama.cpp as target and draft: one target forward per step (a tree batch), the accepted
    path is exactly what that forward's logits say (argmax down the tree), and the output equals the llama.cpp
    baseline's up to the first divergence, which f16 KV rounding may cause and the stats report."""
    from app.core.metrics import first_divergence
    from app.speculative.tree_drafter import TreeDrafter

    ids = eng.encode_prompt(LONG)
    _, base = _lane(eng, None, ids, 40)
    real = LlamaCppDecodeState.forward_tree
    seen: list = []

    def spy(self, toks, parents, keep=0):
        out = real(self, toks, parents, keep=keep)
        if keep:  # the loop's verify forward asks for the tree's rows (a drafter's level forwards do not)
            seen.append((list(toks), list(parents), out))
        return out

    monkeypatch.setattr(LlamaCppDecodeState, "forward_tree", spy)
    for drafter in (TreeDrafter(eng, [3, 2, 1]), TreeDrafter(eng, None, nodes=10, depth=4, branch=3)):
        seen.clear()
        steps, st = _lane(eng, drafter, ids, 40)
        tree_steps = [e for e in steps if e.tree is not None]
        assert st.tree_steps == len(tree_steps) == len(seen) > 0
        for (_toks, _parents, logits), e in zip(seen, tree_steps, strict=True):
            tree = e.tree
            n = len(tree.ids)
            rows = logits[-(n + 1):]  # the last pending token's row, then one per tree node
            node, want = -1, []
            while True:  # greedy down the tree by these logits
                tok = int(rows[node + 1].argmax())
                nxt = next((c for c in range(n) if tree.parents[c] == node and tree.ids[c] == tok), None)
                if nxt is None:
                    break
                want.append(nxt)
                node = nxt
            assert list(tree.path) == want
            if e.target_id is not None:
                assert e.target_id == int(rows[node + 1].argmax())
        d = first_divergence(list(base.output_ids), list(st.output_ids))
        assert st.output_ids[: d if d is not None else None] == base.output_ids[: d if d is not None else None]
        assert st.accepted / st.tree_steps > 1.5  # a self-draft: most of each main line is accepted
