"""What callers may use of an engine: :class:`Engine` (every backend) and :class:`StepEngine` (the engines our loop
drives one forward at a time), the decode state of a step engine, and what backends share (:class:`EngineBase`:
prompts, detokenizing, the defaults of the protocol)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Engine", "StepEngine", "DecodeState", "IncrementalDetokenizer", "EngineBase", "PROBE_TEXT", "check_tokenizers"]

PROBE_TEXT = "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)  # héllo, 世界 🚀"


class DecodeState(Protocol):
    """One sequence's KV cache on one engine. Each lane owns one; weights are shared."""

    @property
    def length(self) -> int:
        """Tokens currently in the cache."""
        ...

    def forward(self, ids: list[int], last_only: bool = False, keep: int = 0) -> Any:
        """Append `ids` to the cache and return float32 logits, [len(ids), vocab], or of the last `keep`
        positions ([1, vocab] if last_only)."""
        ...

    def crop(self, length: int) -> None:
        """Roll the cache back to its first `length` tokens (after rejected drafts)."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A loaded engine of any backend: a target, a draft, a server or a library's generate."""

    name: str
    backend: str  # the manifest's backend (app.engines.backends)
    device: str
    dtype: str  # the precision it runs in ("float32", "int8", "Q4_K_M", "server", …)
    tokenizer: Any
    vocab_size: int  # rows of the logits
    eos_ids: frozenset[int]
    context_length: int | None  # positions for prompt + generated tokens (None: unknown; the scheduler checks it)
    max_prompt_tokens: int | None  # the longest prompt it accepts, when that is a separate limit
    load_s: float  # seconds its load took
    supports_hidden: bool  # gives the hidden state that produced each token (ReDrafter heads)
    supports_tree: bool  # verifies a token tree in one forward

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]: ...

    def detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer: ...

    def decode(self, ids: list[int]) -> str: ...

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA) so timings are true; nothing on CPU."""
        ...


@runtime_checkable
class StepEngine(Engine, Protocol):
    """An engine our speculative loop drives: a decode state per lane, one forward at a time (hf, llamacpp). Only
    these can verify drafts, draft themselves, verify trees and be profiled (app.speculative.costs)."""

    def new_state(self) -> DecodeState: ...


class IncrementalDetokenizer:
    """Turns a growing id sequence into text pieces, right for multi-byte tokens.

    Holds back a token whose bytes do not yet complete a character (the piece is "" and the character
    appears with the token that completes it), as vLLM/TGI do with prefix/read offsets.

    Args:
        decode: ids -> text (special tokens skipped).
        prompt_ids: context before the first generated token.
    """

    def __init__(self, decode, prompt_ids: list[int]) -> None:
        self._decode = decode
        self.ids: list[int] = list(prompt_ids[-6:])
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes ("" when waiting for more bytes)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix : self.read])
        full = self._decode(self.ids[self.prefix :])
        if full.endswith("\ufffd") or len(full) < len(prefix_text):
            return ""
        piece = full[len(prefix_text) :]
        self.prefix, self.read = self.read, len(self.ids)
        if self.prefix > 64:  # keep the window short
            self.ids = self.ids[self.prefix - 6 :]
            self.read -= self.prefix - 6
            self.prefix = 6
        return piece

    def peek(self, ids: list[int]) -> list[str]:
        """Pieces the given ids would produce after the current text, without consuming them (rejected drafts)."""
        saved = (list(self.ids), self.prefix, self.read)
        try:
            return [self.push(i) for i in ids]
        finally:
            self.ids, self.prefix, self.read = saved


def check_tokenizers(target_name: str, target_tok, draft_name: str, draft_tok) -> None:
    """Refuse a draft whose tokenizer differs from the target's: vocab size and the ids of a probe string.

    Called before the draft's weights are loaded.

    Raises:
        VocabMismatchError: naming both engines and what differs.
    """
    from app.core.errors import VocabMismatchError

    tv, dv = len(target_tok), len(draft_tok)
    tp = tuple(target_tok.encode(PROBE_TEXT, add_special_tokens=False))
    dp = tuple(draft_tok.encode(PROBE_TEXT, add_special_tokens=False))
    if tv != dv or tp != dp:
        what = f"vocab {dv} vs {tv}" if tv != dv else "the same text encodes to different ids"
        raise VocabMismatchError(
            f"draft {draft_name!r} and target {target_name!r} do not share a tokenizer ({what})",
            fix="pick a draft of the target's family (e.g. qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct)",
        )


class EngineBase:
    """What backends share: prompt encoding and decoding with an HF-like tokenizer (`self.tokenizer`) and the
    manifest's chat_template flag (`self.manifest`), and the defaults of :class:`Engine`'s optional parts."""

    tokenizer: Any
    manifest: Any
    context_length: int | None = None
    max_prompt_tokens: int | None = None
    load_s: float = 0.0
    supports_hidden: bool = False
    supports_tree: bool = False

    def sync(self) -> None:
        pass

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        tok = self.tokenizer
        if chat and self.manifest.chat_template and getattr(tok, "chat_template", None):
            out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return [int(i) for i in out]
        return [int(i) for i in tok.encode(text, add_special_tokens=True)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.decode, prompt_ids)
