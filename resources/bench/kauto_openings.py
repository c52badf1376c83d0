"""How often an answer's first draft (the opening) was kept, by its confidence band, counted over recorded runs.

k=auto values an opening's first draft at the opening's own estimate over every confidence (AutoK.ended). This counts,
in run files (`.specdeck`), the openings of the fixed draft-model lanes — every such lane drafts on the prompt's
forward, so its step 0 shows the draft's first token, its confidence and the target's verdict — one per prompt, draft
and run file (the lanes of one draft on one prompt open alike), greedy runs only, by backend (llama.cpp where the
draft is a GGUF engine, else PyTorch) and confidence band (below 0.5, 0.5–0.8, 0.8 and above). A prediction's input,
not a speed: no model runs.

    python resources/bench/kauto_openings.py resources/bench/*.specdeck [--json PATH]

Prints, per backend, kept/openings per band (every run file's, and each prompt and draft once), and the
log-likelihood of the verdicts under one estimate for all openings against one per band (Beta(1, 1) means; in-sample,
and each run file's openings from the other files').
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kauto_verdict import run_file_lanes  # noqa: E402  (a run file's lanes by prompt, setup and repeat)

from app.core.errors import SpecDeckError  # noqa: E402
from app.core.report import draft_of  # noqa: E402  (a draft-model setup's draft, precision and target)
from app.core.setups import parse_setup  # noqa: E402
from app.engines.registry import resolve  # noqa: E402

#: the confidence bands counted: below 0.5, 0.5–0.8, 0.8 and above
BANDS = (0.5, 0.8)
BAND_NAMES = ("q<0.5", "0.5-0.8", "q>=0.8")


def band(q: float) -> int:
    """The band (BANDS) of an opening of confidence q."""
    return bisect.bisect_right(BANDS, q)


def openings(path: str) -> list[dict]:
    """The openings of a run file's fixed draft-model lanes: one per (prompt, draft), as {file, prompt, draft, backend,
    q, kept} (`draft`: app.core.report.draft_of without its "draft:", the engine, precision and target); none from a sampled run. Raises
    SpecDeckError where the file cannot be read or names an engine not known here."""
    rec, lanes = run_file_lanes(path)
    if rec.plan.sampling.temperature > 0:
        return []
    out, seen = [], set()
    for (prompt, setup, _), steps in sorted(lanes.items()):
        st = parse_setup(setup)
        if st.prefix != "draft" or st.k == "auto":
            continue
        draft = (draft_of(setup) or setup).removeprefix("draft:")
        step0 = next((s for s in steps if s.step == 0), None)
        if (prompt, draft) in seen or step0 is None or not step0.drafted_ids or not step0.draft_probs:
            continue
        seen.add((prompt, draft))
        out.append(dict(file=str(path), prompt=prompt, draft=draft,
                        backend="llama.cpp" if resolve(st.engine).backend == "llamacpp" else "PyTorch",
                        q=float(step0.draft_probs[0]), kept=step0.accepted_count >= 1))
    return out


def _estimates(train: list[dict]) -> tuple[float, list[float]]:
    """Beta(1, 1) means of an opening being kept over `train`: over every band, and per band."""
    kept = [0] * len(BAND_NAMES)
    n = [0] * len(BAND_NAMES)
    for r in train:
        kept[band(r["q"])] += int(r["kept"])
        n[band(r["q"])] += 1
    return (sum(kept) + 1) / (sum(n) + 2), [(k + 1) / (m + 2) for k, m in zip(kept, n, strict=True)]


def _loglik(rows: list[dict], train: list[dict]) -> tuple[float, float]:
    """The log-likelihood of `rows`' verdicts under `train`'s estimate over every band, and under its per-band ones."""
    pooled, banded = _estimates(train)

    def ll(p: float, kept: bool) -> float:
        return math.log(max(1e-6, p if kept else 1.0 - p))

    return (sum(ll(pooled, r["kept"]) for r in rows), sum(ll(banded[band(r["q"])], r["kept"]) for r in rows))


def summary(rows: list[dict]) -> dict:
    """Per band [kept, openings], over every run file's openings and over each (prompt, draft) once; log-likelihoods of
    the verdicts under one estimate against one per band, in-sample and each run file's from the other files'."""
    counts = [[0, 0] for _ in BAND_NAMES]
    for r in rows:
        c = counts[band(r["q"])]
        c[0] += int(r["kept"])
        c[1] += 1
    distinct = [[0, 0] for _ in BAND_NAMES]  # each (prompt, draft) once: its first run file's opening
    for r in {(r["prompt"], r["draft"]): r for r in reversed(rows)}.values():
        c = distinct[band(r["q"])]
        c[0] += int(r["kept"])
        c[1] += 1
    in_sample = _loglik(rows, rows)
    held = [_loglik([r for r in rows if r["file"] == f], [r for r in rows if r["file"] != f])
            for f in sorted({r["file"] for r in rows})]
    return dict(openings=sum(c[1] for c in counts), kept=sum(c[0] for c in counts),
                by_band={name: c for name, c in zip(BAND_NAMES, counts, strict=True)},
                distinct_by_band={name: c for name, c in zip(BAND_NAMES, distinct, strict=True)},
                loglik_pooled=in_sample[0], loglik_banded=in_sample[1],
                loglik_pooled_held_out=sum(h[0] for h in held), loglik_banded_held_out=sum(h[1] for h in held))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run files (.specdeck)")
    ap.add_argument("--json", help="write the openings and the counts here")
    args = ap.parse_args()
    rows: list[dict] = []
    for path in args.runs:
        try:
            rows += openings(path)
        except SpecDeckError as e:
            print(f"{path}: skipped ({e})", file=sys.stderr)
    by_backend = defaultdict(list)
    for r in rows:
        by_backend[r["backend"]].append(r)
    out = {}
    for backend, rs in sorted(by_backend.items()):
        s = out[backend] = summary(rs)
        bands = ", ".join(f"{b} {k}/{m}" for b, (k, m) in s["by_band"].items())
        print(f"{backend}: {s['openings']} openings over {len({r['file'] for r in rs})} run files, kept {s['kept']} "
              f"({s['kept'] / max(1, s['openings']):.2f}); by confidence: {bands}")
        print("  each prompt and draft once: " + ", ".join(f"{b} {k}/{m}" for b, (k, m) in s["distinct_by_band"].items()))
        print(f"  log-likelihood of the verdicts, one estimate / one per band: in-sample {s['loglik_pooled']:.1f} / "
              f"{s['loglik_banded']:.1f}; each run file from the others {s['loglik_pooled_held_out']:.1f} / "
              f"{s['loglik_banded_held_out']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(summary=out, openings=rows), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
