"""The run report: one JSON schema for `bench`, the GUI export and saved runs (see DESIGN.md)."""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from app.core.errors import SetupError, SpecDeckError
from app.core.events import StepEvent
from app.core.metrics import LaneStats, baseline_of, draft_differences, first_divergence, is_baseline, setup_target, summarize

__all__ = ["attach_baseline", "build_report", "category_speedups", "draft_of", "draft_parting", "RUN_KEYS", "check_writable", "write_json"]

RUN_KEYS = (
    "setup",
    "prompt_id",
    "repeat",
    "new_tokens",
    "wall_s",
    "ttft_s",
    "tokens_per_s",
    "steps",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_len",
    "output_ids",
    "output_text",
    "identical_to_baseline",
    "speedup",
)


def attach_baseline(runs: Sequence[LaneStats], reference: str | None = None,
                    comparable: Callable[[str, str], bool] | None = None) -> list[LaneStats]:
    """Fill identical_to_baseline / first_divergence / speedup of every run from the baseline run of its own
    target (`baseline` or `baseline@<target>`) on the same prompt and repeat, and — with `reference`, a setup
    label — reference_divergence from that setup's run (computed, never assumed). `comparable(setup, reference)`
    says whether two setups' targets share a tokenizer: token ids of different vocabularies are not compared (the
    run gets reference_comparable False)."""
    base = {(r.setup, r.prompt_id, r.repeat): r for r in runs if is_baseline(r.setup)}
    ref = {(r.prompt_id, r.repeat): r for r in runs if reference is not None and r.setup == reference}
    out = []
    for r in runs:
        b = base.get((baseline_of(r.setup), r.prompt_id, r.repeat))
        r = r.with_baseline(b) if b is not None else r
        x = ref.get((r.prompt_id, r.repeat))
        if x is not None and x is not r:
            if comparable is None or comparable(r.setup, x.setup):
                r = replace(r, reference_divergence=first_divergence(r.output_ids, x.output_ids))
            else:
                r = replace(r, reference_comparable=False)
        out.append(r)
    return out


def category_speedups(doc: dict) -> dict[str, dict[str, float]]:
    """setup → prompt category → Σ baseline wall / Σ setup wall over the report's runs of that category, each setup
    against the baseline of its own target (categories where either has no run are left out)."""
    cats = doc.get("categories") or {}
    walls: dict[tuple[str, str], float] = {}
    for r in doc["runs"]:
        c = cats.get(r["prompt_id"])
        if c is not None:
            walls[(r["setup"], c)] = walls.get((r["setup"], c), 0.0) + r["wall_s"]
    out: dict[str, dict[str, float]] = {}
    for s in doc["summary"]:
        row = out.setdefault(s["setup"], {})
        for c in dict.fromkeys(cats.values()):
            b, w = walls.get((baseline_of(s["setup"]), c)), walls.get((s["setup"], c))
            if b and w:
                row[c] = b / w
    return out


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def draft_of(setup: str) -> str | None:
    """A draft-model lane's draft, as a setup names it without its drafting rule ("draft:D,dtype=int8[@T]": lanes with
    the same draft, precision and target), None for other kinds. transformers' assisted generation (`hf-assisted:D`)
    counts as a lane of its assistant: the same engine built at the same precision (the worker's `draft(D, dtype)`),
    drafting greedily on the same answer."""
    from app.core.setups import parse_setup

    try:
        st = parse_setup(setup)
    except SpecDeckError:
        return None
    if getattr(st, "prefix", None) not in ("draft", "hf-assisted"):
        return None
    return f"draft:{st.engine}" + (f",dtype={st.dtype}" if st.dtype else "") + (f"@{st.target}" if st.target else "")


def draft_parting(lanes: Sequence[tuple[str, str, int, Sequence[StepEvent]]]) -> list[dict]:
    """Where lanes of one draft model (several setups of the same draft, precision and target, greedy) drafted other
    tokens on the same prefix of a prompt's answer (app.core.metrics.draft_differences), per draft over the run: the
    answer positions two of its lanes both drafted (each pair of lanes of a prompt and repeat), those where the
    tokens differed, and the prompts where any did.

    Args:
        lanes: (setup, prompt id, repeat, the lane's StepEvents) of the run's finished lanes.

    Returns:
        One entry per draft with at least two setups compared: {"draft", "setups", "shared", "differ", "prompts",
        "prompts_differ"} (prompts: distinct prompt ids, whatever the repeats); a draft whose steps do not say their
        tokens (trees) is left out.
    """
    by: dict[str, dict[tuple[str, int], list[tuple[str, Sequence[StepEvent]]]]] = {}
    for setup, prompt, repeat, steps in lanes:
        d = draft_of(setup)
        if d is not None:
            by.setdefault(d, {}).setdefault((prompt, repeat), []).append((setup, steps))
    out = []
    for d, groups in by.items():
        shared = differ = 0
        setups: set[str] = set()
        compared: set[str] = set()
        parted: set[str] = set()
        for (prompt, _), group in groups.items():
            diffs = []
            for i, (x, sx) in enumerate(group):
                for y, sy in group[i + 1:]:
                    if (r := draft_differences(sx, sy)) is not None:
                        diffs.append((x, y, r[0], len(r[1])))
            if not diffs:
                continue
            compared.add(prompt)
            if any(n_diff for *_, n_diff in diffs):
                parted.add(prompt)
            for x, y, n, n_diff in diffs:
                setups |= {x, y}
                shared, differ = shared + n, differ + n_diff
        if compared and shared:
            out.append(dict(draft=d, setups=len(setups), shared=shared, differ=differ, prompts=len(compared), prompts_differ=len(parted)))
    return out


def build_report(
    target: str,
    device: str,
    dtype: str,
    runs: Sequence[LaneStats],
    *,
    sampling: dict | None = None,
    extra: dict | None = None,
    reference: str | None = None,
    comparable: Callable[[str, str], bool] | None = None,
) -> dict:
    """The JSON document: {"target", "device", "dtype", "runs": [...], "summary": [...]} plus metadata.

    Each run carries the DESIGN.md keys first, then the extra measurements (prefill, draft/verify times,
    per-position acceptance, first divergence).
    """
    runs = attach_baseline(runs, reference, comparable)
    run_rows = []
    for r in runs:
        d = r.to_json()
        row = {k: d[k] for k in RUN_KEYS}
        row.update({k: v for k, v in d.items() if k not in row})
        run_rows.append(row)
    doc = {
        "target": target,
        "device": device,
        "dtype": dtype,
        "runs": run_rows,
        "summary": [s.to_json() for s in summarize(runs)],
        "sampling": sampling or {},
        "reference": reference,
        "targets": list(dict.fromkeys(setup_target(r.setup) or target for r in runs)),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "processor": platform.processor()},
    }
    if extra:
        doc.update(extra)
    return _clean(doc)


def check_writable(path: str, flag: str = "--json") -> None:
    """Refuse an output path that cannot be written, before any work is done.

    Raises:
        SetupError: a folder, a missing folder or an unwritable place (the message names the flag and the fix).
    """
    p = os.path.abspath(path)
    parent = os.path.dirname(p) or "."
    if os.path.isdir(p):
        raise SetupError(f"{flag} {path}: is a folder", fix=f"give a file name, e.g. {flag} report.json")
    if not os.path.isdir(parent):
        raise SetupError(f"{flag} {path}: the folder {parent} does not exist", fix=f"create it (mkdir -p {parent}) or pick another path")
    if not os.access(parent, os.W_OK) or (os.path.exists(p) and not os.access(p, os.W_OK)):
        raise SetupError(f"{flag} {path}: not writable here", fix="pick a path you can write to")


def write_json(doc: dict, path: str) -> str:
    """Write `doc` to `path`; if that fails, to a file in the current or temp folder. Returns where it went.

    Raises:
        SpecDeckError: when no place could take it (the message names every place tried).
    """
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    tried = []
    name = f"specdeck-report-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for where in (path, os.path.join(os.getcwd(), name), os.path.join(tempfile.gettempdir(), name)):
        try:
            with open(where, "w", encoding="utf-8") as f:
                f.write(text)
            return where
        except OSError as e:
            tried.append(f"{where}: {e.strerror or e}")
    raise SpecDeckError("could not save the report: " + "; ".join(tried), fix="free disk space or pick another --json path")
