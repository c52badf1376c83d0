"""The toy "models" behind the FAKE tensorrt_llm: deterministic next-token rules over a 50-token vocabulary.

`target_next` is the target's greedy choice; `draft_next` agrees with it except at every third position, so a
draft/target pair has both accepted and rejected drafts. `sampled_next` is the target *sampling* (a seeded
pseudo-random pick that differs from the greedy choice most of the time), so a test can tell whether a lane
really sampled. EOS is id 2 (never produced unless `EOS_AT` is set to the sequence length at which the target
emits it). `CHUNKS` is the cycle of tokens per streamed iteration the fake LLM API and the fake streaming runner
emit after the 1-token prefill (capped at max_draft_len + 1).

Tests set the module's knobs with monkeypatch:
* EOS_AT, CHUNKS, STREAM_K: as above.
* PERF_METRICS: what `request_perf_metrics.speculative_decoding` holds at the end of a request —
  "zeros" (TensorRT-LLM 1.2.x on the PyTorch backend's default TorchSampler: the fields exist, all 0; fixed
  upstream by PR #17082, July 2026), "filled" (the counts, as after that fix) or None (no perf metrics at all).
* PERF_TOTALS: (total_draft_tokens, total_accepted_draft_tokens) to report instead of the per-iteration counts.
* MAX_INPUT_LEN / MAX_SEQ_LEN: built runner engines' limits when the engine folder has no config.json
  (trtllm-build's defaults: max_input_len 1024; max_seq_len None = unlimited here).
"""

from __future__ import annotations

VOCAB = 50
EOS = 2
EOS_AT: int | None = None
CHUNKS: list[int] = [3, 1, 4, 2, 1]
PERF_METRICS: str | None = "zeros"
PERF_TOTALS: tuple[int, int] | None = None
MAX_INPUT_LEN = 1024
MAX_SEQ_LEN: int | None = None
STREAM_K = 4  # max_draft_len the fake streaming runner (ReDrafter, Medusa) caps its chunks with


def target_next(seq: list[int]) -> int:
    if EOS_AT is not None and len(seq) == EOS_AT:
        return EOS
    return (seq[-1] * 7 + len(seq)) % 47 + 3


def draft_next(seq: list[int]) -> int:
    t = target_next(seq)
    return t if len(seq) % 3 else (t - 3 + 1) % 47 + 3


def sampled_next(seed: int):
    """The target sampling with `seed`: a next-token rule that differs from `target_next` at most positions."""

    def nxt(seq: list[int]) -> int:
        if EOS_AT is not None and len(seq) == EOS_AT:
            return EOS
        h = (seed * 1_000_003 + len(seq) * 7919 + seq[-1] * 104_729) % 2_147_483_647
        return (target_next(seq) - 3 + 1 + h % 45) % 47 + 3

    return nxt


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
