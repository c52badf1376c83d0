"""llama.cpp engines (`backend = "llamacpp"`): a GGUF run as it is through llama-cpp-python — no dequantisation, no
fp32 copy — driven step by step by SpecDeck's loop like any other engine.

* Weights: the manifest's GGUF (parts joined once into the cache, size and sha256 checked: app.engines.cache
  .prepare_gguf). One `llama_model` per engine; each lane's :class:`LlamaCppDecodeState` owns a llama context
  (its KV cache) on that model, so interleaved lanes never share a cache.
* `forward(ids, keep=...)` is one batched `llama_decode` over the new tokens that asks logits only for the
  positions the loop reads (the last `keep`), not for the prompt; `crop(n)` removes KV entries past n
  (`llama_memory_seq_rm`).
* Token trees (`forward_tree`/`select`, tree and ReDrafter-shaped lanes): llama.cpp takes no attention mask, so
  each branch gets a sequence id held by the KV cells of its whole root path (one unified KV cache per lane,
  TREE_SEQS ids); a tree is one batch, the kept path stays in place and the other branches' cells are freed.
  The kept path then lies among freed cells, which changes the order of later attention sums: with the f16 KV
  cache logits move slightly, one more numerics difference the reports show (tests/engines/test_llamacpp.py
  bounds it).
* Tokenizer and chat template: llama.cpp's own, from the GGUF (:class:`GGUFTokenizer`), so the same text gives the
  ids llama.cpp itself would use; SpecDeck's cross-engine tokenizer check (vocab size + probe ids) applies, so a
  llama.cpp draft can serve a PyTorch target of the same family and the other way round.
* Numerics: llama.cpp's batched kernels give slightly different logits for a token evaluated in a batch than
  alone, which can flip near-ties; the verifier is exact on the logits it is given, and the
  reports show the first divergence from the baseline instead of hiding it.

API facts (llama-cpp-python 0.3.36, read from its installed sources; nothing copied): `llama_cpp.Llama(model_path,
n_ctx, n_batch, n_threads, n_threads_batch, logits_all, verbose)`, `._model` / `._ctx` / `.context_params`,
`llama_cpp._internals.LlamaContext(model=, params=, verbose=)` and `LlamaBatch(n_tokens=, embd=, n_seq_max=)`,
`llama_cpp.llama_get_logits_ith`, `llama_cpp.llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, p1)` and
`llama_memory_seq_cp(mem, src, dst, p0, p1)`, `llama_context_params.n_seq_max` / `.kv_unified`; from the vendored
llama.cpp sources: the KQ mask follows each token's first sequence id (llama-kv-cache.cpp), and a batch's
sequences must continue their cached positions, coupled ones from the same cached state (llama-batch.cpp),
`Llama.tokenize(bytes, add_bos, special)` / `detokenize(ids, special=)`, `Llama.metadata` (GGUF key/values).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from app.core.errors import EngineError
from app.core.threads import cpu_threads
from app.engines.backends import LLAMACPP_INSTALL_HINT
from app.engines.base import EngineBase
from app.engines.cache import ProgressFn, prepare_gguf
from app.engines.manifest import EngineManifest

__all__ = ["GGUFTokenizer", "LlamaCppDecodeState", "LlamaCppEngine", "load_gguf_tokenizer", "tokenizer_only", "physical_cores", "INSTALL_HINT",
           "TREE_SEQS"]

INSTALL_HINT = LLAMACPP_INSTALL_HINT
TREE_SEQS = 64  # sequence ids per lane context: the plain sequence and up to 63 branches of a token tree


def physical_cores() -> int:
    """llama.cpp's default threads: SPECDECK_THREADS when set (app.core.threads), else the physical cores (llama.cpp is
    fastest with one thread per core), from psutil, else the logical count."""
    n = cpu_threads()
    if n is not None:
        return n
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
        self._batch = _internals.LlamaBatch(n_tokens=engine.n_batch, embd=0, n_seq_max=TREE_SEQS, verbose=False)
        self._len = 0
        # a token tree since the last select/crop (forward_tree): slot -> (parent slot, position, first seq id);
        # slots below _base are the plain sequence (seq 0, slot s at position s)
        self._tree: dict[int, tuple[int, int, int]] = {}
        self._base = 0
        self._end: dict[int, int] = {}  # seq id -> the deepest slot of its line (a child there may take the same id)
        self._owner: dict[int, int] = {}  # seq id -> the slot it was opened at (-1: seq 0, the plain sequence)

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
        if self._tree:  # after a tree: continue from its last token, seeing that token's ancestors only
            return self.forward_tree(ids, list(range(self._len - 1, self._len - 1 + len(ids))), keep=1 if last_only else keep)
        n = len(ids)
        self._check_room(n)
        return self._decode(ids, [self._len + i for i in range(n)], [(0,)] * n, 1 if last_only else keep)

    def _check_room(self, n: int) -> None:
        e = self.engine
        if n == 0:
            raise ValueError("forward of no tokens")
        if self._len + n > e.n_ctx:
            raise EngineError(f"engine {e.name}: {self._len + n} positions exceed its context of {e.n_ctx}",
                              fix=f"raise n_ctx in the [llamacpp] table of {e.manifest.where} or lower --max-new-tokens")

    def _decode(self, ids: list[int], pos: list[int], seqs: list[tuple[int, ...]], keep: int) -> torch.Tensor:
        """llama_decode n_batch tokens at a time (token j at pos[j] in the sequences seqs[j]; its attention follows
        the first); float32 logits of the last `keep` tokens (all when 0), computed for those only."""
        import llama_cpp

        e, n = self.engine, len(ids)
        first_kept = n - (keep if 0 < keep < n else n)
        rows: list[np.ndarray] = []
        b = self._batch.batch
        for start in range(0, n, e.n_batch):
            chunk = range(start, min(n, start + e.n_batch))
            b.n_tokens = len(chunk)
            for i, j in enumerate(chunk):
                b.token[i] = ids[j]
                b.pos[i] = pos[j]
                b.n_seq_id[i] = len(seqs[j])
                for k, sq in enumerate(seqs[j]):
                    b.seq_id[i][k] = sq
                b.logits[i] = j >= first_kept
            rc = llama_cpp.llama_decode(self.ctx.ctx, b)
            if rc != 0:
                raise EngineError(f"engine {e.name}: llama_decode failed ({rc}) at position {pos[start]}",
                                  fix="the context may be full: raise n_ctx in the manifest's [llamacpp] table")
            for i, j in enumerate(chunk):
                if j >= first_kept:
                    ptr = llama_cpp.llama_get_logits_ith(self.ctx.ctx, i)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(e.vocab_size,)).copy())
        self._len += n
        return torch.from_numpy(np.stack(rows))

    def forward_tree(self, ids: list[int], parents: list[int], keep: int = 0) -> torch.Tensor:
        """Append a token tree in one batch; float32 logits [len(ids), vocab] (or of the last `keep`).

        Args:
            ids: the tokens, parents before children.
            parents: the cache slot of each token's parent (the new tokens take slots length … length + n − 1):
                the plain sequence's last token, or a tree token since the last :meth:`select`.

        llama.cpp takes no attention mask; it builds one from sequence ids: a token sees the KV cells that hold
        its first sequence id, at positions up to its own. So each branch of the tree gets an id of its own, held
        by every token on the path to it: a child that continues its parent's line keeps the parent's id, a
        further child opens a new id, which is copied onto its cached ancestors' cells (llama_memory_seq_cp, no
        recompute) and added to its ancestors' ids in this batch. Needs the unified KV cache the engine's lane
        contexts are made with; at most TREE_SEQS − 1 branches per tree.
        """
        import llama_cpp

        n, start = len(ids), self._len
        if len(parents) != n:
            raise ValueError(f"{n} tree tokens but {len(parents)} parents")
        self._check_room(n)
        if not self._tree:
            self._base, self._end, self._owner = start, {0: start - 1}, {0: -1}
        ends = dict(self._end)  # restored if the tree is refused
        extra: dict[int, list[int]] = {}  # in-batch slot -> the ids of further branches below it
        copies: list[tuple[int, int, int]] = []  # (from seq, to seq, up to position) onto cached ancestors
        try:
            for i, par in enumerate(parents):
                slot = start + i
                if not self._base - 1 <= par < slot:
                    raise ValueError(f"tree token {i}: parent slot {par} is neither the plain sequence's last token "
                                     f"({self._base - 1}) nor a tree token before slot {slot}")
                ppos, pseq = (self._tree[par][1], self._tree[par][2]) if par >= self._base else (par, 0)
                if self._end.get(pseq) == par:
                    seq = pseq  # the parent's line goes on
                else:
                    seq = self._open_seq(slot)
                    a = par
                    while a >= start:  # in this batch: the new id rides along with the ancestors' tokens
                        extra.setdefault(a, []).append(seq)
                        a = self._tree[a][0]
                    copies.append((self._tree[a][2], seq, self._tree[a][1] + 1) if a >= self._base else (0, seq, a + 1))
                self._end[seq] = slot
                self._tree[slot] = (par, ppos + 1, seq)
        except Exception:
            for slot in range(start, start + n):
                self._tree.pop(slot, None)
            self._owner = {q: at for q, at in self._owner.items() if at < start}
            self._end = ends
            if not self._tree:
                self._base = 0
            raise
        mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        for src, dst, upto in copies:
            llama_cpp.llama_memory_seq_cp(mem, src, dst, 0, upto)
        slots = range(start, start + n)
        return self._decode(ids, [self._tree[s][1] for s in slots], [(self._tree[s][2], *extra.get(s, ())) for s in slots], keep)

    def _open_seq(self, slot: int) -> int:
        seq = next((q for q in range(1, TREE_SEQS) if q not in self._owner), None)
        if seq is None:
            raise EngineError(f"engine {self.engine.name}: a token tree of more than {TREE_SEQS - 1} branches",
                              fix="use a smaller tree (fewer leaves) for llama.cpp lanes")
        self._owner[seq] = slot
        return seq

    def select(self, slots: list[int]) -> None:
        """Keep only the cache slots `slots` (ascending), which must form a plain sequence again: the plain
        sequence's first tokens, then (optionally) one root path of the tree. The path's KV cells stay where they
        are (seq 0 moves onto them); every other branch's cells are freed."""
        import llama_cpp

        n = len(slots)
        plain = self._base if self._tree else self._len
        first = 0
        while first < n and first < plain and slots[first] == first:
            first += 1
        path = slots[first:]
        ok = not path or (bool(self._tree) and first == self._base)
        for j, s in enumerate(path):
            node = self._tree.get(s)
            ok = ok and node is not None and node[1] == first + j and node[0] == (path[j - 1] if j else first - 1)
        if not ok:
            raise ValueError(f"slots {path} after {first} are not one path of the cached tree")
        mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        if path:
            _, pos, seq = self._tree[path[-1]]
            if seq != 0:  # seq 0 leaves the other branch and takes the kept path's cells
                llama_cpp.llama_memory_seq_rm(mem, 0, self._base, -1)
                llama_cpp.llama_memory_seq_cp(mem, seq, 0, self._base, pos + 1)
            else:
                llama_cpp.llama_memory_seq_rm(mem, 0, pos + 1, -1)
        elif n < self._len:
            llama_cpp.llama_memory_seq_rm(mem, 0, n, -1)
        for seq in self._owner:
            if seq:
                llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
        self._tree.clear()
        self._end.clear()
        self._owner.clear()
        self._base = 0
        self._len = n

    def crop(self, length: int) -> None:
        """Remove KV entries at positions >= `length`."""
        import llama_cpp

        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length} outside 0..{self._len}")
        mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        if self._tree and length <= self._base:
            self.select(list(range(length)))
            return
        for slot in range(self._len - 1, length - 1, -1) if self._tree else ():  # tree tokens, children first
            par, pos, seq = self._tree.pop(slot)
            if self._owner.get(seq) == slot:  # the branch opened here goes entirely
                llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
                del self._owner[seq], self._end[seq]
            else:
                llama_cpp.llama_memory_seq_rm(mem, seq, pos, -1)
                self._end[seq] = par
        if not self._tree and length < self._len:
            llama_cpp.llama_memory_seq_rm(mem, 0, length, -1)
        self._len = length


class LlamaCppEngine(EngineBase):
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
    supports_tree = True  # LlamaCppDecodeState.forward_tree / select: token trees through sequence ids

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
        table = manifest.extra.get("llamacpp", {}) or {}  # validated with the manifest (app.engines.backends.llamacpp_keys)
        try:
            from llama_cpp import Llama
        except ImportError:
            raise EngineError(f"engine {self.name}: llama-cpp-python is not installed", fix=INSTALL_HINT) from None
        self.gguf = prepare_gguf(manifest, progress)
        self.n_threads = int(table.get("n_threads", physical_cores()))
        self.n_batch = int(table.get("n_batch", 512))
        t0 = time.perf_counter()
        progress(f"load {self.name}", 0, 1, "")
        try:
            # The weights are read into memory (use_mmap=False): with a mapped file, llama.cpp's CPU repacking of the
            # quantised matrices keeps both the mapped pages and the repacked copy resident (resources/bench/memory.py
            # measures it; its figures: resources/bench/README.md). The Llama's own context stays small: every lane gets
            # a context of its own with `lane_params` (n_ctx positions).
            self.llm = Llama(model_path=str(self.gguf), n_ctx=256, n_batch=256, n_ubatch=256, use_mmap=False,
                             n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=False, verbose=False)
            from llama_cpp import llama_context_params

            self.lane_params = llama_context_params.from_buffer_copy(self.llm.context_params)
            self.lane_params.n_batch = self.lane_params.n_ubatch = self.n_batch
            # token trees (forward_tree) need several sequence ids over one KV cache of n_ctx cells; with a single
            # sequence this is the same cache and the same batch split as before
            self.lane_params.n_seq_max = TREE_SEQS
            self.lane_params.kv_unified = True
        except Exception as e:
            raise EngineError(f"cannot load engine {self.name} from {self.gguf}: {type(e).__name__}: {e}",
                              fix=f"check the GGUF (python -m app engines) or reinstall its package: {' '.join(manifest.requires)}") from None
        self.load_s = time.perf_counter() - t0
        progress(f"load {self.name}", 1, 1, "")
        train = _int(self.llm.metadata.get(f"{self.llm.metadata.get('general.architecture', '')}.context_length"))
        n_ctx = int(table.get("n_ctx", min(4096, train or 4096)))
        if train and n_ctx > train:  # a lane's context would hold positions the model never saw, and their KV memory
            self.llm.close()
            raise EngineError(f"engine {self.name}: [llamacpp] n_ctx = {n_ctx} is more than the {train} positions the model was trained for",
                              fix=f"set n_ctx to at most {train} in the [llamacpp] table of {manifest.where} (or leave it unset)")
        self.n_ctx = self.lane_params.n_ctx = n_ctx
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


def tokenizer_only(manifest: EngineManifest, progress: ProgressFn, lookup=None) -> GGUFTokenizer:
    """The backend's tokenizer without weights (app.engines.backends): the GGUF's vocabulary."""
    return load_gguf_tokenizer(manifest, progress)


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
