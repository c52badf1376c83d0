"""The toy "models" behind the FAKE tensorrt_llm: deterministic next-token rules over a 50-token vocabulary.

`target_next` is the target's greedy choice; `draft_next` agrees with it except at every third position, so a
draft/target pair has both accepted and rejected drafts. EOS is id 2 (never produced unless `EOS_AT` is set to
the sequence length at which the target emits it). `CHUNKS` is the cycle of tokens per streamed iteration the
fake LLM API and the fake streaming runner emit after the 1-token prefill (capped at max_draft_len + 1).
Tests set the module's knobs (EOS_AT, CHUNKS, PERF_METRICS, PERF_TOTALS, STREAM_K, MAX_SEQ_LEN) with monkeypatch.
"""

from __future__ import annotations

VOCAB = 50
EOS = 2
EOS_AT: int | None = None
CHUNKS: list[int] = [3, 1, 4, 2, 1]
PERF_METRICS = True  # whether the fake LLM API reports request_perf_metrics.speculative_decoding
# (total_draft_tokens, total_accepted_draft_tokens) the fake LLM API reports instead of its per-iteration counts
# (a real executor's counters need not match what the lane infers from streamed updates)
PERF_TOTALS: tuple[int, int] | None = None
MAX_SEQ_LEN: int | None = None  # the fake runner engines' max_seq_len: generate returns no token past it
STREAM_K = 4  # max_draft_len the fake streaming runner (ReDrafter, Medusa) caps its chunks with


def target_next(seq: list[int]) -> int:
    if EOS_AT is not None and len(seq) == EOS_AT:
        return EOS
    return (seq[-1] * 7 + len(seq)) % 47 + 3


def draft_next(seq: list[int]) -> int:
    t = target_next(seq)
    return t if len(seq) % 3 else (t - 3 + 1) % 47 + 3


def greedy(seq: list[int], n: int, nxt=target_next, end_id: int | None = EOS) -> list[int]:
    """n tokens after seq (fewer when end_id is produced; end_id itself included)."""
    seq, out = list(seq), []
    for _ in range(n):
        t = nxt(seq)
        seq.append(t)
        out.append(t)
        if t == end_id:
            break
    return out


def chunk_sizes(total: int, k: int) -> list[int]:
    """1 (prefill), then CHUNKS cycled and capped at k + 1, summing to total."""
    sizes, i = [], 0
    left = total
    if left > 0:
        sizes.append(1)
        left -= 1
    while left > 0:
        n = min(CHUNKS[i % len(CHUNKS)], k + 1, left)
        sizes.append(n)
        left -= n
        i += 1
    return sizes
