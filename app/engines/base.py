"""The engine protocol the speculative loop drives, and tokenizer helpers shared by backends."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Engine", "DecodeState", "IncrementalDetokenizer", "TokenizerMixin", "PROBE_TEXT", "check_tokenizers"]

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


class Engine(Protocol):
    name: str
    vocab_size: int  # rows of the logits
    eos_ids: frozenset[int]
    device: str
    dtype: str
    context_length: int | None  # positions for prompt + generated tokens (None: unknown; the scheduler checks it)

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]: ...

    def new_state(self) -> DecodeState: ...

    def detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer: ...

    def decode(self, ids: list[int]) -> str: ...


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


class TokenizerMixin:
    """Prompt encoding and decoding shared by backends that hold an HF tokenizer (`self.tokenizer`) and a
    manifest (`self.manifest`, for its chat_template flag)."""

    tokenizer: Any
    manifest: Any

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
