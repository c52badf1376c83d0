"""llama.cpp engines (`backend = "llamacpp"`): a GGUF run as it is through llama-cpp-python — no dequantisation, no
fp32 copy — driven step by step by SpecDeck's loop like any other engine.

* Weights: the manifest's GGUF (parts joined once into the cache, size and sha256 checked: app.engines.cache
  .prepare_gguf). One `llama_model` per engine; each lane's :class:`LlamaCppDecodeState` owns a llama context
  (its KV cache) on that model, so interleaved lanes never share a cache.
* `forward(ids, keep=...)` is one batched `llama_decode` over the new tokens that asks logits only for the
  positions the loop reads (the last `keep`), not for the prompt; `crop(n)` removes KV entries past n
  (`llama_memory_seq_rm`).
* Tokenizer and chat template: llama.cpp's own, from the GGUF (:class:`GGUFTokenizer`), so the same text gives the
  ids llama.cpp itself would use; SpecDeck's cross-engine tokenizer check (vocab size + probe ids) applies, so a
  llama.cpp draft can serve a PyTorch target of the same family and the other way round.
* Numerics: llama.cpp's batched kernels give slightly different logits for a token evaluated in a batch than
  alone (up to ~0.5 here), which can flip near-ties; the verifier is exact on the logits it is given, and the
  reports show the first divergence from the baseline instead of hiding it.

API facts (llama-cpp-python 0.3.36, read from its installed sources; nothing copied): `llama_cpp.Llama(model_path,
n_ctx, n_batch, n_threads, n_threads_batch, logits_all, verbose)`, `._model` / `._ctx` / `.context_params`,
`llama_cpp._internals.LlamaContext(model=, params=, verbose=)` and `LlamaBatch(n_tokens=, embd=, n_seq_max=)`,
`llama_cpp.llama_get_logits_ith`, `llama_cpp.llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, p1)`,
`Llama.tokenize(bytes, add_bos, special)` / `detokenize(ids, special=)`, `Llama.metadata` (GGUF key/values).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from app.core.errors import EngineError
from app.engines.base import TokenizerMixin
from app.engines.cache import ProgressFn, prepare_gguf
from app.engines.registry import EngineManifest

__all__ = ["GGUFTokenizer", "LlamaCppDecodeState", "LlamaCppEngine", "load_gguf_tokenizer", "physical_cores", "INSTALL_HINT"]

INSTALL_HINT = "pip install llama-cpp-python==0.3.36 (compiles llama.cpp with cmake: a few minutes; `make` does it)"
_KEYS = {"n_ctx", "n_threads", "n_batch"}


def physical_cores() -> int:
    """Physical cores (llama.cpp is fastest with one thread per core), from psutil, else the logical count."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)


class GGUFTokenizer:
    """llama.cpp's tokenizer from the GGUF, with the parts of an HF tokenizer SpecDeck uses (`len`, `encode`,
    `decode`, `eos_token_id`, `chat_template`, `apply_chat_template`)."""

    def __init__(self, model) -> None:
        self._model = model  # llama_cpp._internals.LlamaModel (a full model, or a vocab-only load)
        meta: dict[str, str] = dict(model.metadata())
        self.eos_token_id = int(model.token_eos())
        bos = int(model.token_bos())
        self.bos_token_id = bos if bos >= 0 else None
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "true" if self.bos_token_id is not None else "false") == "true"
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self._n = int(model.n_vocab())

    def __len__(self) -> int:
        return self._n

    def _piece(self, token: int | None) -> str:
        if token is None or token < 0:
            return ""
        return self._model.token_to_piece(token, special=True).rstrip(b"\0").decode("utf-8", "replace")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text` (special tokens in the text are parsed as such, as HF tokenizers do); BOS when the GGUF
        says to add one and `add_special_tokens`."""
        return [int(t) for t in self._model.tokenize(text.encode("utf-8"), add_special_tokens and self.add_bos, True)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if not len(ids):
            return ""
        return self._model.detokenize([int(i) for i in ids], special=not skip_special_tokens).decode("utf-8", "replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = True):
        """The GGUF's chat template rendered with jinja2 (sandboxed), then tokenized without an extra BOS."""
        if not self.chat_template:
            raise EngineError("this GGUF has no chat template", fix="use --no-chat, or a GGUF with tokenizer.chat_template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise EngineError(f"the GGUF's chat template refused the conversation: {message}", fix="use --no-chat")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._piece(self.bos_token_id), eos_token=self._piece(self.eos_token_id),
        )
        return [int(t) for t in self._model.tokenize(text.encode("utf-8"), False, True)] if tokenize else text


class LlamaCppDecodeState:
    """One lane's llama context (its own KV cache) on a LlamaCppEngine's model."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        from llama_cpp import _internals

        self.engine = engine
        self.ctx = _internals.LlamaContext(model=engine.llm._model, params=engine.lane_params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=engine.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._len = 0

    def close(self) -> None:
        """Free the native context and batch now. llama-cpp-python's model keeps a reference to every context it
        made (to free them before itself), so a dropped LlamaContext is never collected: without this each lane
        leaked its KV cache and logits buffers (~54 MB for Qwen 0.5B, measured)."""
        for res in (getattr(self, "ctx", None), getattr(self, "_batch", None)):
            if res is not None:
                res.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def length(self) -> int:
        return self._len

    def forward(self, ids: list[int], last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append `ids` (batched, n_batch at a time); float32 logits [len(ids), vocab], or of the last `keep`
        positions ([1, vocab] when last_only). Only those positions' logits are computed by llama.cpp."""
        import llama_cpp

        e = self.engine
        n = len(ids)
        if n == 0:
            raise ValueError("forward of no tokens")
        if self._len + n > e.n_ctx:
            raise EngineError(f"engine {e.name}: {self._len + n} positions exceed its context of {e.n_ctx}",
                              fix=f"raise n_ctx in the [llamacpp] table of {e.manifest.where} or lower --max-new-tokens")
        want = 1 if last_only else (keep if 0 < keep < n else n)
        first_kept = n - want
        rows: list[np.ndarray] = []
        b = self._batch.batch
        for start in range(0, n, e.n_batch):
            chunk = ids[start : start + e.n_batch]
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = self._len + start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = start + i >= first_kept
            rc = llama_cpp.llama_decode(self.ctx.ctx, b)
            if rc != 0:
                raise EngineError(f"engine {e.name}: llama_decode failed ({rc}) at position {self._len + start}",
                                  fix="the context may be full: raise n_ctx in the manifest's [llamacpp] table")
            for i in range(len(chunk)):
                if start + i >= first_kept:
                    ptr = llama_cpp.llama_get_logits_ith(self.ctx.ctx, i)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(e.vocab_size,)).copy())
        self._len += n
        return torch.from_numpy(np.stack(rows))

    def crop(self, length: int) -> None:
        """Remove KV entries at positions >= `length`."""
        import llama_cpp

        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length} outside 0..{self._len}")
        if length < self._len:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx.ctx), 0, length, -1)
            self._len = length


class LlamaCppEngine(TokenizerMixin):
    """A GGUF run by llama.cpp, from a `backend = "llamacpp"` manifest.

    Args:
        manifest: the engine manifest (`[llamacpp]`: n_ctx, n_threads, n_batch).
        device: "cpu" (or None/"auto"); this llama-cpp-python build runs on the CPU.
        dtype: ignored: the GGUF's own quantisation is what runs (reported as `dtype`, e.g. "Q4_K_M").
        progress: callback (task, done, total, unit).

    Raises:
        EngineError: llama-cpp-python missing, bad manifest table, wrong size/sha256, unreadable GGUF.
    """

    backend = "llamacpp"

    def __init__(self, manifest: EngineManifest, device: str | None = None, dtype: str | None = None,
                 progress: ProgressFn | None = None, tokenizer=None) -> None:
        progress = progress or (lambda *a: None)
        self.manifest = manifest
        self.name = manifest.name
        dev = device or manifest.device
        if dev not in (None, "auto", "cpu"):
            raise EngineError(f"engine {self.name}: llama.cpp lanes run on the CPU in this build, device {dev!r} requested",
                              fix="leave --device unset or use --device cpu for llama.cpp engines")
        self.device = "cpu"
        table = manifest.extra.get("llamacpp", {}) or {}
        for k in table:
            if k not in _KEYS:
                raise EngineError(f"engine manifest {manifest.where}: unknown key {k!r} in [llamacpp]", fix=f"allowed: {', '.join(sorted(_KEYS))}")
        for k, v in table.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise EngineError(f"engine manifest {manifest.where}: [llamacpp] {k} must be a positive integer, got {v!r}", fix=f"edit {manifest.where}")
        try:
            from llama_cpp import Llama
        except ImportError:
            raise EngineError(f"engine {self.name}: llama-cpp-python is not installed", fix=INSTALL_HINT) from None
        self.gguf = prepare_gguf(manifest, progress)
        self.n_threads = int(table.get("n_threads", physical_cores()))
        self.n_batch = int(table.get("n_batch", 512))
        t0 = time.perf_counter()
        progress(f"load {self.name}", 0, 1, "")
        n_ctx = int(table.get("n_ctx", 4096))
        try:
            # The weights are read into memory (use_mmap=False): with a mapped file, llama.cpp's CPU repacking of the
            # quantised matrices kept both the mapped pages and the repacked copy resident (Qwen 1.5B: +1.77 GiB of
            # RSS for a 1.04 GiB file, against +1.20 GiB read). The Llama's own context stays small: every lane gets
            # a context of its own with `lane_params` (n_ctx positions).
            self.llm = Llama(model_path=str(self.gguf), n_ctx=256, n_batch=256, n_ubatch=256, use_mmap=False,
                             n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=False, verbose=False)
            from llama_cpp import llama_context_params

            self.lane_params = llama_context_params.from_buffer_copy(self.llm.context_params)
            self.lane_params.n_ctx = n_ctx
            self.lane_params.n_batch = self.lane_params.n_ubatch = self.n_batch
        except Exception as e:
            raise EngineError(f"cannot load engine {self.name} from {self.gguf}: {type(e).__name__}: {e}",
                              fix=f"check the GGUF (python -m app engines) or reinstall its package: {' '.join(manifest.requires)}") from None
        self.load_s = time.perf_counter() - t0
        progress(f"load {self.name}", 1, 1, "")
        self.n_ctx = n_ctx
        train = _int(self.llm.metadata.get(f"{self.llm.metadata.get('general.architecture', '')}.context_length"))
        self.context_length: int | None = min(self.n_ctx, train) if train else self.n_ctx
        self.tokenizer = tokenizer if tokenizer is not None else GGUFTokenizer(self.llm._model)
        self.vocab_size = int(self.llm.n_vocab())
        self.dtype = _file_type(self.llm)
        self.eos_ids = frozenset(_eog_ids(self.llm) | {self.tokenizer.eos_token_id})
        self.lookup_pool: list = []  # Llamas (logits_all) lent to llamacpp-lookup lanes, one per lane at a time

    def new_state(self) -> LlamaCppDecodeState:
        return LlamaCppDecodeState(self)

    def sync(self) -> None:
        pass


def load_gguf_tokenizer(manifest: EngineManifest, progress: ProgressFn | None = None) -> GGUFTokenizer:
    """The GGUF's tokenizer alone (llama.cpp's vocab-only load: no weights), for the check before a draft loads.

    Raises:
        EngineError: llama-cpp-python missing, or the GGUF unreadable.
    """
    try:
        from llama_cpp import _internals, llama_model_default_params
    except ImportError:
        raise EngineError(f"engine {manifest.name}: llama-cpp-python is not installed", fix=INSTALL_HINT) from None
    path = prepare_gguf(manifest, progress or (lambda *a: None))
    params = llama_model_default_params()
    params.vocab_only = True
    try:
        return GGUFTokenizer(_internals.LlamaModel(path_model=str(path), params=params, verbose=False))
    except Exception as e:
        raise EngineError(f"cannot read the tokenizer of engine {manifest.name} from {path}: {type(e).__name__}: {e}",
                          fix=f"reinstall its package: {' '.join(manifest.requires)}") from None


def _int(x: Any) -> int | None:
    try:
        n = int(x)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _file_type(llm) -> str:
    """The GGUF's quantisation as llama.cpp names it (general.file_type), e.g. "Q4_K_M"."""
    from app.engines.gguf_header import FILE_TYPES

    ft = _int(llm.metadata.get("general.file_type"))
    return FILE_TYPES.get(ft or 0, f"ftype {ft}") if ft is not None else "F32"


def _eog_ids(llm) -> set[int]:
    """Every end-of-generation token of the vocabulary (EOS, EOT, <|im_end|>, …), as llama.cpp marks them."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    return {i for i in range(int(llm.n_vocab())) if llama_cpp.llama_vocab_is_eog(vocab, i)}
