"""Distilling a ReDrafter head (app.speculative.redrafter) from a target, on this machine's CPU, within a time budget,
resumably: what `python -m app train-drafter` (app.commands.train_drafter) runs.

Data (all local, nothing downloaded):

* the target's own generations (greedy), 16 prompts per left-padded batch, for the built-in suite prompts that no
  benchmark suite uses (specbench minus specbench-mini) and for coding/editing task prompts made from the corpus'
  functions (:func:`_task_prompts`): the text the head will draft for, GEN_SHARE of the gathering time;
* local corpora: Python's standard library sources (always on the machine) and any `--corpus` files or folders,
  read in windows of 256 tokens and fed to the target once (teacher forcing).

Each position i gives the target's final normed hidden state h_i and its greedy next token y_i. The head learns,
from h_i and the tokens that follow, to predict y_{i+1} … y_{i+D} (cross-entropy over a reduced vocabulary: the
`--vocab` most frequent target tokens among the labels; rarer labels are skipped). Held out: the target's
generations for the specbench-mini prompts (which contain the palindrome/rename and quick prompts), never trained
on. Half of its sequences validate: every minute the head's loss on them is measured and the best head so far is
the one saved (a head overfits a few ten thousand positions within minutes); the other half is the report: per
depth d, the share of its positions where the head's greedy chain (and its beam tree) gets the target's next d
tokens right.

Everything lives in the head's folder (app.speculative.redrafter.heads_dir()/<name>): `work/features-*.pt` (the
extracted data), `work/ckpt.pt` (head, optimiser, step, seconds trained), and the usable head (`head.safetensors`,
`head.json`), saved every minute and at the end. Running the command again resumes: the data is reused and training
continues for another `--minutes`; `--fresh` starts over.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from app.core.errors import SetupError

__all__ = ["train", "evaluate", "gather", "load_features", "validate"]

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 256  # tokens per corpus window
BATCH = 8  # corpus windows per target forward
GEN_TOKENS = 128  # tokens the target generates per prompt (at most)
GEN_BATCH = 16  # prompts generated together (a batched decode step costs little more than one)
GEN_SHARE = 0.6  # the share of the gathering time spent generating (the rest: corpus windows, teacher-forced)
NOISE = 0.1  # relative Gaussian noise on the target's hidden states while training
CODE_PROMPT = "Continue this Python code:\n\n{}"


class _Say:
    """Progress lines on stderr, at most one every `every` seconds unless forced."""

    def __init__(self, quiet: bool, every: float = 5.0) -> None:
        self.quiet, self.every, self.t = quiet, every, 0.0

    def __call__(self, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if force or now - self.t >= self.every:
            self.t = now
            print(text, file=sys.stderr, flush=True)


# --- data ---------------------------------------------------------------------------------------------------------
def _suite_prompts(name: str) -> list[str]:
    f = ROOT / "resources" / "suites" / f"{name}.jsonl"
    return [json.loads(line)["prompt"] for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def _corpus_files(extra: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in extra:
        path = Path(p).expanduser()
        if path.is_dir():
            files += sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in (".py", ".md", ".txt", ".rst", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java"))
        elif path.is_file():
            files.append(path)
        else:
            raise SetupError(f"--corpus {p}: no such file or folder", fix="give a text file or a folder of source files")
    std = Path(sysconfig.get_paths()["stdlib"])
    files += sorted(f for f in std.glob("*.py"))
    return files


def _read(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


_NEW_NAMES = ("count", "total", "result", "value", "items", "index", "data", "text", "parts", "found", "buf", "acc")


def _functions(files: list[Path], rng: random.Random, n: int) -> list[tuple[str, str, str, list[str]]]:
    """Up to n short functions from the corpus' Python files: (source, signature line, docstring's first line,
    names the body assigns)."""
    import ast
    import textwrap

    out: list[tuple[str, str, str, list[str]]] = []
    for f in rng.sample(files, len(files)):
        if f.suffix != ".py":
            continue
        text = _read(f)
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        fns = [d for d in ast.walk(tree) if isinstance(d, ast.FunctionDef) and d.end_lineno and 3 <= d.end_lineno - d.lineno < 16]
        for d in rng.sample(fns, min(len(fns), 6)):
            src = textwrap.dedent("\n".join(lines[d.lineno - 1 : d.end_lineno]))
            sig = src.splitlines()[0]
            if not sig.rstrip().endswith(":") or len(sig) > 100:
                continue
            doc = (ast.get_docstring(d) or "").strip().splitlines()
            names = sorted({t.id for t in ast.walk(d) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)})
            out.append((src, sig, doc[0].rstrip(".") if doc else "", names))
        if len(out) >= n:
            break
    return out[:n]


def _task_prompts(files: list[Path], rng: random.Random, n: int) -> list[str]:
    """Prompts in the built-in suites' coding and editing styles, made from the corpus' own functions: complete a
    function from its signature and docstring, write one by name, rename a variable, add type hints, continue code.
    (The held-out specbench-mini prompts are never among them.)"""
    out: list[str] = []
    for src, sig, doc, names in _functions(files, rng, n):
        kinds = ["continue", "hints"] + (["complete", "write"] if doc else []) + (["rename"] if names else [])
        kind = rng.choice(kinds)
        if kind == "complete":
            out.append(f"Complete this Python function that {doc[:1].lower()}{doc[1:]}:\n\n{sig}\n")
        elif kind == "write":
            out.append(f"Write a Python function `{sig.strip()[4:].split(')')[0]})` that {doc[:1].lower()}{doc[1:]}.")
        elif kind == "rename":
            old = rng.choice(names)
            new = next((x for x in rng.sample(_NEW_NAMES, len(_NEW_NAMES)) if x not in src), "renamed")
            out.append(f"Rename the variable `{old}` to `{new}` everywhere in this code and return the whole code:\n\n{src}\n")
        elif kind == "hints":
            out.append(f"Add type hints to every function in this code and return the whole code:\n\n{src}\n")
        else:
            cut = src.splitlines()[: rng.randint(2, 6)]
            out.append(CODE_PROMPT.format("\n".join(cut)))
    return out


@torch.inference_mode()
def _features(engine, seqs: list[list[int]]) -> list[dict]:
    """Sequences of equal length through the target in one batch: ids, final normed hidden states (float16) and
    greedy next tokens, per sequence."""
    x = torch.tensor(seqs)
    h = engine.model.get_decoder()(input_ids=x).last_hidden_state  # [B, T, H]
    y = engine.model.get_output_embeddings()(h).argmax(-1)
    return [{"ids": x[b].clone(), "h": h[b].to(torch.float16), "y": y[b]} for b in range(len(seqs))]


@torch.inference_mode()
def _generate(engine, prompt_ids: list[int], n: int) -> list[int]:
    """The target's greedy continuation of one prompt, token by token (the reference for :func:`_generate_batch`)."""
    s = engine.new_state()
    logits = s.forward(prompt_ids, last_only=True)[-1]
    out: list[int] = []
    for _ in range(n):
        t = int(logits.argmax())
        out.append(t)
        if t in engine.eos_ids:
            break
        logits = s.forward([t], last_only=True)[-1]
    return out


@torch.inference_mode()
def _generate_batch(engine, prompts: list[list[int]], n: int, deadline: float = math.inf) -> list[dict]:
    """Greedy generations for several prompts in one left-padded batch, and their features from the same passes.

    Decoding is memory-bound on a CPU: a step for 16 sequences costs little more than for one, so this gathers the
    target's own text several times faster than :func:`_generate`. Returns per prompt what :func:`_features` returns
    for prompt + generation (ids, normed final hidden states as float16, greedy next tokens y); a generated token is
    the y of the position before it, and the last position's y is the token that ended the generation (EOS or the
    n-th, or the last one generated by the deadline, a time.monotonic() value)."""
    model = engine.model
    dec, lm = model.get_decoder(), model.get_output_embeddings()
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = dec(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache = out.past_key_values
    hs = [out.last_hidden_state.to(torch.float16)]
    ys = [torch.stack([lm(out.last_hidden_state[b]).argmax(-1) for b in range(B)])]  # row by row: logits stay small
    ended = [n] * B  # generated tokens kept per sequence (through its EOS)
    for k in range(n - 1):
        nxt = ys[-1][:, -1]
        for b in range(B):
            if ended[b] == n and int(nxt[b]) in engine.eos_ids:
                ended[b] = k + 1
        if all(e <= k + 1 for e in ended):
            break
        if time.monotonic() >= deadline:
            ended = [min(e, k + 1) for e in ended]
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], 1)
        pos = pos[:, -1:] + 1
        out = dec(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        hs.append(out.last_hidden_state.to(torch.float16))
        ys.append(lm(out.last_hidden_state).argmax(-1))
    h, y = torch.cat(hs, 1), torch.cat(ys, 1)  # [B, L + steps, ...]
    feats = []
    for b, p in enumerate(prompts):
        lo, hi = L - len(p), L + min(ended[b], h.shape[1] - L + 1) - 1  # positions: the prompt, then generated tokens but the last
        gen = y[b, L - 1 : hi - 1]
        feats.append({"ids": torch.cat([torch.tensor(list(p)), gen]), "h": h[b, lo:hi].clone(), "y": y[b, lo:hi].clone()})
    return feats


def gather(engine, work: Path, deadline: float, corpus: list[str], seed: int, say: _Say) -> None:
    """Extract features into `work` until the deadline. First the held-out set: the target's generations for the
    specbench-mini prompts (a fifth of the time at most); then training data: the target's generations for the
    other suite prompts and for task prompts made from the corpus (:func:`_task_prompts`), GEN_BATCH at a time, for
    GEN_SHARE of the time, in turn with corpus windows (teacher forcing). Resumes from what `work/data.json` says is
    done; an interrupted gathering (Ctrl-C) writes what it had before it stops, so the next run continues from it."""
    g = _Gatherer(engine, work, corpus, seed, say)
    try:
        g.held_out(deadline)
        g.training_data(deadline)
    finally:
        g.flush()
    g.progress(force=True)


class _Gatherer:
    """One gathering's state: what is done (`work/data.json`), the features not yet written, the sources left."""

    def __init__(self, engine, work: Path, corpus: list[str], seed: int, say: _Say) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.engine, self.work, self.say = engine, work, say
        self.state_f = work / "data.json"
        self.state: dict[str, Any] = (json.loads(self.state_f.read_text()) if self.state_f.is_file()
                                      else {"done": [], "positions": 0, "heldout": 0, "chunks": 0, "generated_s": 0.0})
        self.state.setdefault("generated", 0)
        self.done = set(self.state["done"])
        rng = random.Random(seed)
        self.files = _corpus_files(corpus)
        self.heldout = _suite_prompts("specbench-mini")
        self.train_prompts = [p for p in _suite_prompts("specbench") if p not in set(self.heldout)] + _task_prompts(self.files, rng, 1500)
        rng.shuffle(self.files)
        self.buf: list[dict] = []
        self.t0 = time.monotonic()

    def flush(self) -> None:
        """Write the features gathered so far and what is done."""
        if self.buf:
            torch.save(list(self.buf), self.work / f"features-{self.state['chunks']:04d}.pt")
            self.state["chunks"] += 1
            self.buf.clear()
        self.state["done"] = sorted(self.done)
        self.state_f.write_text(json.dumps(self.state))

    def add(self, feats: list[dict], held: bool) -> None:
        for f in feats:
            f["heldout"] = held
            self.buf.append(f)
            self.state["positions"] += len(f["ids"])
            self.state["heldout"] += len(f["ids"]) if held else 0
        if sum(len(b["ids"]) for b in self.buf) >= 16384:
            self.flush()

    def progress(self, force: bool = False) -> None:
        st = self.state
        self.say(f"data: {st['positions']:,} positions ({st['heldout']:,} held out; {st['generated']:,} tokens generated "
                 f"by the target), {len(self.done)} sources, {time.monotonic() - self.t0:.0f} s", force)

    def generate(self, part: list[tuple[str, str]], held: bool, until: float) -> None:
        t = time.monotonic()
        p_ids = [self.engine.encode_prompt(p) for _, p in part]
        feats = _generate_batch(self.engine, p_ids, GEN_TOKENS, until)
        self.state["generated"] += sum(len(f["ids"]) - len(p) + 1 for f, p in zip(feats, p_ids, strict=True))
        self.add(feats, held)
        self.done.update(k for k, _ in part)
        self.state["generated_s"] += time.monotonic() - t
        self.progress()

    def pending(self, prefix: str, prompts: list[str]) -> list[tuple[str, str]]:
        return [(f"{prefix}:{i}", p) for i, p in enumerate(prompts) if f"{prefix}:{i}" not in self.done]

    def held_out(self, deadline: float) -> None:
        """The held-out generations, a fifth of the time at most."""
        until = min(deadline, self.t0 + max(1.0, deadline - self.t0) / 5)
        todo = self.pending("held", self.heldout)
        while todo and time.monotonic() < until:
            part, todo = todo[:GEN_BATCH], todo[GEN_BATCH:]
            self.generate(part, True, until)

    def training_data(self, deadline: float) -> None:
        """Generations (GEN_SHARE of the time) in turn with corpus windows, until the deadline."""
        windows: list[list[int]] = []
        todo = self.pending("gen", self.train_prompts)
        files = [f for f in self.files if f"file:{f}" not in self.done]
        while time.monotonic() < deadline and (todo or files or len(windows) >= BATCH):
            spent = time.monotonic() - self.t0
            if todo and (self.state["generated_s"] < spent * GEN_SHARE or not (files or len(windows) >= BATCH)):
                part, todo = todo[:GEN_BATCH], todo[GEN_BATCH:]
                self.generate(part, False, deadline)
                continue
            self._windows(files, windows)
        if self.state["positions"] == self.state["heldout"]:
            # the budget ran out before any training data (a loaded machine): one batch of corpus windows (a single
            # forward) past the deadline, rather than a run that trains on nothing
            self._windows(files, windows, partial=True)

    def _windows(self, files: list[Path], windows: list[list[int]], partial: bool = False) -> bool:
        """Cut corpus files into windows until a batch is ready; turn a full batch (`partial`: what there is) into
        features. True: features were added."""
        while len(windows) < BATCH and files:
            f = files.pop(0)
            ids = self.engine.tokenizer(_read(f), add_special_tokens=False)["input_ids"][: WINDOW * 8]
            windows += [ids[j : j + WINDOW] for j in range(0, len(ids) - WINDOW + 1, WINDOW)]
            self.done.add(f"file:{f}")
        if not windows or (len(windows) < BATCH and not partial):
            return False
        self.add(_features(self.engine, windows[:BATCH]), False)
        del windows[:BATCH]
        self.progress()
        return True


def load_features(work: Path) -> tuple[list[dict], list[dict]]:
    train: list[dict] = []
    held: list[dict] = []
    for f in sorted(work.glob("features-*.pt")):
        for d in torch.load(f, weights_only=True):
            (held if d["heldout"] else train).append(d)
    return train, held


# --- training -----------------------------------------------------------------------------------------------------
def _choose_vocab(train: list[dict], n: int, target_vocab: int, eos: frozenset[int]) -> torch.Tensor:
    counts = torch.zeros(target_vocab, dtype=torch.long)
    for d in train:
        counts += torch.bincount(d["y"], minlength=target_vocab)[:target_vocab]
    for e in eos:
        counts[e] += 1 << 40  # always draftable
    n = min(n, target_vocab)
    return torch.topk(counts, n).indices


def _examples(data: list[dict], depth: int) -> list[tuple[int, int]]:
    """(sequence, position) pairs with `depth` tokens after them."""
    return [(s, i) for s, d in enumerate(data) for i in range(len(d["ids"]) - depth - 1)]


def _batch(data, ex, embed, t2d, depth):
    h = torch.stack([data[s]["h"][i] for s, i in ex]).float()  # [B, H]
    x = torch.stack([data[s]["ids"][i + 1 : i + 1 + depth] for s, i in ex])  # [B, D]: the tokens that followed
    y = torch.stack([data[s]["y"][i + 1 : i + 1 + depth] for s, i in ex])  # [B, D]: the target's next tokens
    return h, embed[x].float(), t2d[y]


def _loss(head, h, e, labels) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.zeros_like(h)
    losses, hits = [], []
    for j in range(e.shape[1]):
        g, logits = head.step(g, e[:, j], h)
        losses.append(torch.nn.functional.cross_entropy(logits, labels[:, j], ignore_index=-100))
        hits.append((logits.argmax(-1) == labels[:, j]).float().mean())
    return torch.stack(losses).mean(), torch.stack(hits)


@torch.inference_mode()
def validate(head, embed: torch.Tensor, val: list[dict], t2d: torch.Tensor, depth: int, limit: int = 2048) -> tuple[float, list[float]]:
    """The head's loss and top-1 by depth on the validation sequences (no feature noise)."""
    ex = _examples(val, depth)[:limit]
    if not ex:
        return float("nan"), []
    was = head.training
    head.eval()
    tot, hits = 0.0, torch.zeros(depth)
    for i in range(0, len(ex), 512):
        part = ex[i : i + 512]
        loss, h = _loss(head, *_batch(val, part, embed, t2d, depth))
        tot += float(loss) * len(part)
        hits += h * len(part)
    head.train(was)
    return tot / len(ex), (hits / len(ex)).tolist()


def evaluate(head, embed: torch.Tensor, held: list[dict], depth: int, beams: int = 4, limit: int = 1500) -> dict:
    """Held-out acceptance per depth: the share of positions where the head's greedy chain (`chain`) or its beam tree
    (`tree`, `beams` wide) gets the target's next d tokens right — what greedy verification would accept."""
    from app.speculative.redrafter import beam_tree

    ex = [(s, i) for s, d in enumerate(held) for i in range(len(d["ids"]) - depth - 1)]
    random.Random(1).shuffle(ex)
    ex = ex[:limit]
    chain = [0] * depth
    tree = [0] * depth
    for s, i in ex:
        d = held[s]
        h = d["h"][i].float()
        truth = d["y"][i + 1 : i + 1 + depth].tolist()  # the target's greedy continuation after token i + 1
        # the data's tokens must be the target's own for that to be what it would emit (generations: always)
        if d["ids"][i + 1 : i + 1 + depth].tolist() != d["y"][i : i + depth].tolist():
            continue
        t = beam_tree(head, embed, h, int(d["ids"][i + 1]), depth, 1)
        for j in range(min(depth, len(t.ids))):
            if t.ids[j] != truth[j]:
                break
            chain[j] += 1
        bt = beam_tree(head, embed, h, int(d["ids"][i + 1]), depth, beams)
        node, reach = -1, 0
        for tok in truth:
            nxt = next((c for c in bt.children(node) if bt.ids[c] == tok), None)
            if nxt is None:
                break
            node, reach = nxt, reach + 1
        for j in range(reach):
            tree[j] += 1
    n = max(1, sum(1 for s, i in ex if held[s]["ids"][i + 1 : i + 1 + depth].tolist() == held[s]["y"][i : i + depth].tolist()))
    return {"positions": n, "chain": [c / n for c in chain], "tree": [c / n for c in tree], "beams": beams}


def train(engine, name: str, minutes: float, corpus: list[str], vocab: int, depth: int, data_share: float, fresh: bool,
          seed: int, quiet: bool, min_steps: int = 0) -> dict:
    """Gather data and train within `minutes`; save the head. Returns the head's training summary.

    An interrupt (Ctrl-C) while gathering keeps the data gathered; while training, the head and its checkpoint are
    saved first. Either way the next run continues.
    """
    from app.speculative.redrafter import head_folder

    if not engine.supports_hidden:
        raise SetupError(f"{engine.name}: ReDrafter heads need the target's hidden states (hf backend)", fix="train for an hf engine")
    say = _Say(quiet)
    torch.manual_seed(seed)
    folder = head_folder(name)  # a plain name: a direct child of the heads folder, the only thing --fresh deletes
    if fresh and folder.is_dir():
        import shutil

        shutil.rmtree(folder)
    t_start = time.monotonic()
    budget = minutes * 60.0
    ckpt_f = folder / "work" / "ckpt.pt"
    ckpt = torch.load(ckpt_f, weights_only=False) if ckpt_f.is_file() else None
    if ckpt is None:  # a fresh run gathers data first (an interrupted gathering continues)
        gather(engine, folder / "work", t_start + budget * min(0.9, max(0.1, data_share)), corpus, seed, say)
    t = _Trainer(engine, name, folder, ckpt, vocab, depth, corpus, say)
    if not t.train_data:
        raise SetupError(f"no training data was gathered for {name} in {minutes:g} minutes", fix="give more --minutes")
    return t.run(t_start + budget, seed, min_steps)


def learning_rate(step: int, clock_frac: float, run_steps: int, min_steps: int) -> float:
    """The rate at overall step `step`: a warm-up over the first 50 steps, then a cosine decay to a tenth over this
    run — how far it is: by the clock (`clock_frac` of its budget), or by `min_steps` where those are further off
    (`run_steps` made so far), so a busy machine whose gathering ate the budget still decays over the steps it
    trains rather than training them all at the floor."""
    frac = min(clock_frac, run_steps / min_steps) if min_steps > 0 else clock_frac
    return 1e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, frac)))))


class _Trainer:
    """One training run of a head: from a checkpoint or new, validated every minute, the best head kept."""

    def __init__(self, engine, name: str, folder: Path, ckpt: dict | None, vocab: int, depth: int, corpus: list[str], say: _Say) -> None:
        from app.speculative.redrafter import HeadConfig, ReDrafterHead

        self.engine, self.name, self.folder, self.depth, self.corpus, self.say = engine, name, folder, depth, corpus, say
        self.work = folder / "work"
        self.train_data, self.held = load_features(self.work)
        # choose the head on one half of the held-out data, report the other
        self.val, self.test = (self.held[1::2], self.held[0::2]) if len(self.held) > 1 else (self.held, self.held)
        self.embed = engine.input_embeddings.detach()
        H, V = self.embed.shape[1], engine.vocab_size
        if ckpt is None:
            vocab_ids = _choose_vocab(self.train_data, vocab, V, engine.eos_ids) if self.train_data else torch.arange(min(vocab, V))
            self.head = ReDrafterHead(HeadConfig(hidden=H, vocab=len(vocab_ids), target_vocab=V))
            self.head.vocab_ids.copy_(vocab_ids)
            with torch.no_grad():
                self.head.out.weight.copy_(engine.output_rows(vocab_ids))
            self.step, self.trained_s = 0, 0.0
            self.best: dict[str, Any] = {"loss": math.inf, "step": 0, "state": None}
        else:
            self.head = ReDrafterHead(HeadConfig(**ckpt["config"]))
            self.head.load_state_dict(ckpt["head"])
            self.step, self.trained_s = ckpt["step"], ckpt["trained_s"]
            self.best = ckpt.get("best") or {"loss": math.inf, "step": 0, "state": None}
        self.t2d = torch.full((V,), -100, dtype=torch.long)
        self.t2d[self.head.vocab_ids] = torch.arange(len(self.head.vocab_ids))
        self.head.out.weight.requires_grad_(False)  # the target's own output rows: the head learns to speak its hidden space
        self.opt = torch.optim.AdamW([p for p in self.head.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
        if ckpt is not None:
            self.opt.load_state_dict(ckpt["opt"])
        self.n_pos = sum(len(d["ids"]) for d in self.train_data)
        self.t_run = time.monotonic()

    def run(self, deadline: float, seed: int, min_steps: int = 0) -> dict:
        """Train until the deadline — and at least until this run made `min_steps` steps (a busy machine still gets
        that much training, its learning rate scheduled over whichever is further off) — saving every minute (and on
        an interrupt); returns the final summary."""
        head = self.head
        ex = _examples(self.train_data, self.depth)
        rng = random.Random(seed + self.step)
        self.say(f"train: {len(ex):,} examples from {self.n_pos:,} positions, head {sum(p.numel() for p in head.parameters()) / 1e6:.1f} M "
                 f"parameters ({len(head.vocab_ids):,}-token vocabulary), depth {self.depth}", force=True)
        self.t_run = last_save = time.monotonic()
        run_s = max(1.0, deadline - self.t_run)
        ema = None
        head.train()
        try:
            step0, until_step = self.step, self.step + max(0, min_steps)
            while time.monotonic() < deadline or self.step < until_step:
                lr = learning_rate(self.step, (time.monotonic() - self.t_run) / run_s, self.step - step0, min_steps)
                for grp in self.opt.param_groups:
                    grp["lr"] = lr
                h, e, labels = _batch(self.train_data, rng.sample(ex, min(128, len(ex))), self.embed, self.t2d, self.depth)
                h = h + torch.randn_like(h) * NOISE * h.pow(2).mean(-1, keepdim=True).sqrt()  # EAGLE's feature noise: generalise
                loss, hits = _loss(head, h, e, labels)
                self.opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], 1.0)
                self.opt.step()
                self.step += 1
                ema = hits if ema is None else 0.95 * ema + 0.05 * hits
                self.say(f"train: step {self.step}, loss {loss.item():.3f}, top-1 by depth {' '.join(f'{x:.2f}' for x in ema.tolist())}, "
                         f"{deadline - time.monotonic():.0f} s left")
                if time.monotonic() - last_save > 60:
                    self.save()
                    last_save = time.monotonic()
        except KeyboardInterrupt:
            self.save()
            raise
        return self.save(final=True)

    def check(self) -> None:
        """Validation: keep the best head so far."""
        loss, top1 = validate(self.head, self.embed, self.val, self.t2d, self.depth)
        if loss < self.best["loss"]:
            self.best.update(loss=loss, step=self.step, state={k: v.detach().clone() for k, v in self.head.state_dict().items()})
        self.say(f"validation at step {self.step}: loss {loss:.3f}, top-1 by depth {' '.join(f'{x:.2f}' for x in top1)} "
                 f"(best: step {self.best['step']}, loss {self.best['loss']:.3f})", force=True)

    def save(self, final: bool = False) -> dict:
        """Write the checkpoint (head, optimiser, step) and the usable head: the best one validated."""
        from app.speculative.redrafter import HeadManifest, save_head

        head, best = self.head, self.best
        self.check()
        current = {k: v.detach().clone() for k, v in head.state_dict().items()}
        trained_s = self.trained_s + time.monotonic() - self.t_run
        summary = {"minutes_trained": trained_s / 60, "steps": self.step, "train_positions": self.n_pos,
                   "heldout_positions": sum(len(d["ids"]) for d in self.held), "depth": self.depth, "vocab": len(head.vocab_ids),
                   "parameters": sum(p.numel() for p in head.parameters()), "data": "target generations (specbench minus specbench-mini "
                   "prompts, coding/editing task prompts made from the corpus' functions) + Python stdlib windows"
                   + (" + " + ", ".join(self.corpus) if self.corpus else ""),
                   "best_step": best["step"], "validation_loss": best["loss"]}
        torch.save({"config": vars(head.cfg), "head": current, "opt": self.opt.state_dict(), "step": self.step, "best": best,
                    "trained_s": trained_s}, self.work / "ckpt.tmp")
        os.replace(self.work / "ckpt.tmp", self.work / "ckpt.pt")
        if best["state"] is not None:  # the usable head is the best one validated
            head.load_state_dict(best["state"])
        if final and self.test:
            head.eval()
            summary["heldout_acceptance"] = evaluate(head, self.embed, self.test, self.depth)
        m = HeadManifest(name=self.name, kind="redrafter", target=self.engine.name,
                         target_weights=Path(str(getattr(self.engine, "folder", ""))).name, config=vars(head.cfg), training=summary)
        save_head(self.folder, head, m)
        head.load_state_dict(current)
        head.train()
        return summary
