"""Hugging Face transformers backend (PyTorch, CPU or CUDA; float32, bfloat16, float16, or int8 on CPU).

int8 (dynamic quantization of the linear layers, CPU only) is meant for draft models: a draft's precision only
changes how often its drafts are accepted, never what the target emits.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from app.core.errors import EngineError
from app.engines.base import EngineBase
from app.engines.cache import ProgressFn, prepare, route_progress_bars
from app.engines.manifest import EngineManifest

__all__ = ["HFEngine", "HFDecodeState", "resolve_device", "resolve_dtype", "load_tokenizer", "tokenizer_only"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(
            f"device {device!r} requested but this PyTorch build sees no CUDA GPU (torch {torch.__version__})",
            fix="use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA driver",
        )
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise EngineError(f"unknown device {device!r}", fix="use cpu, cuda or cuda:N")
    return device


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise EngineError(f"unknown dtype {dtype!r}", fix="use float32, bfloat16, float16 or int8 (CPU drafts)")
    return _DTYPES[dtype]


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def tokenizer_only(manifest: EngineManifest, progress: ProgressFn, lookup=None):
    """The engine's tokenizer without loading its weights: its folder's (a GGUF is converted into the cache first,
    once, as loading it would)."""
    return load_tokenizer(prepare(manifest, progress))


def _repair_hint(m: EngineManifest, file: Path | None = None) -> str:
    """What to do about a model folder that does not load: reconvert a cache, or mend the user's own folder."""
    if m.source_kind in ("gguf", "gguf_parts"):
        return f"the converted cache is damaged: run `python -m app convert {m.name} --force`"
    what = f"restore {file.name} (the model's JSON config, as save_pretrained writes it) or replace" if file else "repair or replace"
    return f"{what} the model folder {', '.join(m.source)} (engine {m.where})"


def _read_config(m: EngineManifest, folder: Path) -> dict:
    """The folder's config.json as a dict.

    Raises:
        EngineError: naming the file when it is unreadable or not a JSON object.
    """
    f = folder / "config.json"
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise EngineError(f"engine {m.name}: {f} is not a valid model config ({type(e).__name__}: {e})", fix=_repair_hint(m, f)) from None
    if not isinstance(cfg, dict):
        raise EngineError(f"engine {m.name}: {f} is not a valid model config (a JSON {type(cfg).__name__}, not an object)", fix=_repair_hint(m, f))
    return cfg


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _file_dtype(folder: Path) -> torch.dtype | None:
    """The float dtype of most bytes in the folder's safetensors files (from their headers), or None."""
    sizes: dict[torch.dtype, int] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n)) if 0 < n < 1 << 28 else {}
        for k, v in header.items():
            dt = _SAFETENSORS_DTYPES.get(str(v.get("dtype"))) if k != "__metadata__" and isinstance(v, dict) else None
            if dt is not None:
                a, b = v["data_offsets"]
                sizes[dt] = sizes.get(dt, 0) + b - a
    return max(sizes, key=sizes.__getitem__) if sizes else None


def _load_model(folder: Path, dtype: torch.dtype, device: str, quantized: bool):
    """transformers' model from `folder`, in `dtype` on `device`, without holding two copies of the weights.

    Loaded in the file's own dtype, every weight is a view of the mapped safetensors file (pages read on first use:
    a CPU fp32 load costs nothing until the weights are packed or used). When the dtype or device differs, each
    weight is converted on its own, a block of rows at a time, and its file pages released as it goes
    (`cpu_kernels.copy_released`), where `from_pretrained(dtype=…)` keeps the whole file resident until the last
    weight is converted. Quantized checkpoints and models that keep some modules in fp32 go through
    `from_pretrained(dtype=…)` as they are.
    """
    from transformers import AutoModelForCausalLM

    from app.engines.cpu_kernels import copy_released

    file_dtype = None if quantized else _file_dtype(folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=file_dtype or dtype)
    if file_dtype is None or (file_dtype == dtype and device == "cpu"):
        return model.to(device)
    if getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None):
        del model
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device)
    target = torch.device(device)
    done: dict[int, torch.nn.Parameter] = {}  # id(loaded) -> converted: a tied weight stays one tensor
    with torch.no_grad():
        for mod in model.modules():
            for name, p in list(mod.named_parameters(recurse=False)):
                if id(p) not in done:
                    done[id(p)] = torch.nn.Parameter(copy_released(p, dtype, target), requires_grad=p.requires_grad)
                mod._parameters[name] = done[id(p)]
            for name, b in list(mod.named_buffers(recurse=False)):
                mod._buffers[name] = b.to(target)  # buffers keep their dtype, as from_pretrained(dtype=…) leaves them
    model.config.dtype = dtype
    return model


# What the int8 check feeds the model: code and prose, like the prompts drafts see.
INT8_PROBE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France; Berlin, of Germany.\n"
    "Summary: the function returns the n-th Fibonacci number, 1 + 1 = 2, 2 + 3 = 5."
)


def _vocab_rows(model) -> int:
    """Rows of the output layer (a dynamically quantized Linear exposes its weight as a method)."""
    w = model.get_output_embeddings().weight
    return int((w() if callable(w) else w).shape[0])


class HFDecodeState:
    """One sequence's DynamicCache on an HFEngine."""

    def __init__(self, engine: HFEngine) -> None:
        from transformers import DynamicCache

        self.engine = engine
        self.cache = DynamicCache(config=engine.model.config)
        self._len = 0
        # token-tree slots (forward_tree) since the last select/crop: slot -> parent slot, slot -> position id;
        # slots below _base are a plain sequence (slot s at position s) that every tree token sees
        self._parent: dict[int, int] = {}
        self._pos: dict[int, int] = {}
        self._base = 0
        self.capture_hidden = False  # keep the final normed hidden states of the returned rows in .hidden (ReDrafter)
        self.hidden: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self._len

    @torch.inference_mode()
    def forward(self, ids: list[int], last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append `ids` to the cache; float32 logits [len(ids), vocab], or of the last `keep` positions
        ([1, vocab] when last_only)."""
        if self._parent:  # after a tree: continue from its last token, seeing that token's ancestors only
            return self.forward_tree(ids, list(range(self._len - 1, self._len - 1 + len(ids))), keep=1 if last_only else keep)
        e = self.engine
        x = torch.tensor([ids], dtype=torch.long, device=e.device)  # [1, n]
        pos = torch.arange(self._len, self._len + len(ids), device=e.device)
        keep = 1 if last_only else keep
        with e.hidden_states(self.capture_hidden) as box:
            out = e.model(
                input_ids=x,
                past_key_values=self.cache,
                use_cache=True,
                cache_position=pos,
                logits_to_keep=keep,
            )
        self._keep_hidden(box, keep)
        self._len += len(ids)
        return out.logits[0].float()  # [n or 1, vocab]

    def _keep_hidden(self, box: list, keep: int) -> None:
        if self.capture_hidden:
            h = box[-1][0]  # [n, H]
            self.hidden = (h[-keep:] if keep else h).float()

    @torch.inference_mode()
    def forward_tree(self, ids: list[int], parents: list[int], keep: int = 0) -> torch.Tensor:
        """Append a token tree to the cache in one forward; float32 logits [len(ids), vocab] (or of the last `keep`).

        Args:
            ids: the tokens, parents before children.
            parents: the cache slot of each token's parent (slot = position in the cache; the new tokens take slots
                length … length + n − 1), −1 for none. Each token attends to the plain sequence before the first
                tree slot and to its own ancestors only, at position parent's position + 1.

        Leading tokens that continue the plain sequence go in as such; call :meth:`select` to keep one path.
        """
        e, n, start = self.engine, len(ids), self._len
        lead = 0
        if not self._parent:
            while lead < n and parents[lead] == start + lead - 1:
                lead += 1
            if lead == n:
                return self.forward(ids, keep=keep)
            # the plain part ends at the last token every later one descends from (a branch may leave it earlier)
            lead = max(0, min(lead, min(parents[lead:]) - start + 1))
            self._base = start + lead
        base = self._base
        for i in range(lead, n):
            slot, par = start + i, parents[i]
            if not -1 <= par < slot:
                raise ValueError(f"tree token {i}: parent slot {par} is not before its slot {slot}")
            self._parent[slot] = par
            self._pos[slot] = self._pos.get(par, par) + 1
        total = start + n
        mask = torch.zeros(n, total, dtype=torch.bool)
        mask[:, :base] = True
        if lead:  # the plain-sequence tokens see the tokens before them
            mask[:lead, base - lead : base] = torch.ones(lead, lead, dtype=torch.bool).tril()
        for i in range(lead, n):
            s = start + i
            while s >= base:
                mask[i, s] = True
                s = self._parent[s]
        pos = [start + i for i in range(lead)] + [self._pos[start + i] for i in range(lead, n)]
        with e.hidden_states(self.capture_hidden) as box:
            out = e.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=e.device),
                attention_mask=mask[None, None].to(e.device),
                position_ids=torch.tensor([pos], dtype=torch.long, device=e.device),
                past_key_values=self.cache,
                use_cache=True,
                cache_position=torch.arange(start, total, device=e.device),
                logits_to_keep=keep,
            )
        self._keep_hidden(box, keep)
        self._len = total
        return out.logits[0].float()

    @torch.inference_mode()
    def select(self, slots: list[int]) -> None:
        """Keep only the cache slots `slots` (ascending), which must form a plain sequence again: the accepted path
        of a tree (every slot's parent the slot kept before it). The slots before the first change stay in place."""
        first = 0
        while first < len(slots) and slots[first] == first:
            first += 1
        for j in range(min(first, self._base) if self._parent else first, len(slots)):
            s = slots[j]
            if not (0 <= s < self._len) or self._pos.get(s, s) != j or (j and self._parent.get(s, s - 1) != slots[j - 1]):
                raise ValueError(f"slots {slots[first:]} after {first} are not one path of the cached tree")
        if first < len(slots):
            idx = torch.tensor(slots[first:], dtype=torch.long, device=self.engine.device)
            for layer in self.cache.layers:
                layer.keys[..., first : len(slots), :] = layer.keys.index_select(-2, idx)
                layer.values[..., first : len(slots), :] = layer.values.index_select(-2, idx)
        self._parent.clear()
        self._pos.clear()
        self._base = 0
        n = len(slots)
        if n < self._len:
            self.cache.crop(n - self._len)
        self._len = n

    def crop(self, length: int) -> None:
        """Drop cached tokens beyond `length` (transformers 5.x: crop takes a negative count)."""
        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length} outside 0..{self._len}")
        if self._parent:
            for s in [s for s in self._parent if s >= length]:
                del self._parent[s], self._pos[s]
            if length <= self._base:
                self._parent.clear()
                self._pos.clear()
                self._base = 0
        if length < self._len:
            self.cache.crop(length - self._len)
            self._len = length


class HFEngine(EngineBase):
    """A transformers causal LM plus its tokenizer, loaded from a manifest (converting GGUF once).

    Args:
        manifest: the engine manifest.
        device: "cpu", "cuda[:N]" or "auto"; default from the manifest.
        dtype: "float32", "bfloat16", "float16" or "auto"; default from the manifest.
        progress: callback (task, done, total, unit) for conversion and loading.

    Raises:
        EngineError: missing/corrupt weights, no CUDA, unreadable cache.
    """

    backend = "hf"
    supports_tree = True  # HFDecodeState.forward_tree / select: token trees in one forward

    def __init__(
        self,
        manifest: EngineManifest,
        device: str | None = None,
        dtype: str | None = None,
        progress: ProgressFn | None = None,
        tokenizer=None,
    ) -> None:
        progress = progress or (lambda *a: None)
        self.manifest = manifest
        self.name = manifest.name
        self.device = resolve_device(device or manifest.device)
        quant = (dtype or manifest.dtype) == "int8"
        if quant:
            from app.engines.cpu_kernels import int8_available

            if self.device != "cpu":
                raise EngineError(f"engine {self.name}: int8 runs on the CPU only", fix="on a GPU use dtype=bfloat16 for the draft")
            if not int8_available():
                raise EngineError(
                    f"engine {self.name}: this torch build has no int8 CPU kernels ({torch.backends.quantized.supported_engines})",
                    fix="use dtype=float32 for the draft",
                )
        self.torch_dtype = torch.float32 if quant else resolve_dtype(dtype or manifest.dtype, self.device)
        self.dtype = "int8" if quant else str(self.torch_dtype).removeprefix("torch.")
        self.folder = prepare(manifest, progress)
        config = _read_config(manifest, self.folder)
        t0 = time.perf_counter()
        if tokenizer is None:
            try:
                tokenizer = load_tokenizer(self.folder)
            except Exception as e:
                raise EngineError(f"cannot load the tokenizer of engine {self.name} from {self.folder}: {type(e).__name__}: {e}", fix=_repair_hint(manifest)) from None
        self.tokenizer = tokenizer
        progress(f"load {self.name}", 0, 1, "")
        try:
            with route_progress_bars(progress, lambda: f"load {self.name}: weights"):  # transformers' own bar: to `progress`, not stderr
                self.model = _load_model(self.folder, self.torch_dtype, self.device, quantized="quantization_config" in config)
        except Exception as e:
            raise EngineError(f"cannot load engine {self.name} from {self.folder}: {type(e).__name__}: {e}", fix=_repair_hint(manifest)) from None
        self.model.eval()
        cfg = self.model.config
        self.vocab_size = _vocab_rows(self.model)
        n = getattr(cfg, "max_position_embeddings", None)
        self.context_length: int | None = n if isinstance(n, int) and n > 0 else None  # positions: prompt + generated
        self.packed_linears = self.int8_linears = 0
        self.int8_tv = None
        if quant:
            from app.engines.cpu_kernels import quantize_linears_int8

            progress(f"quantize {self.name} to int8", 0, 1, "")
            probe = self.tokenizer(INT8_PROBE)["input_ids"]
            self.int8_linears, kept, self.int8_tv = quantize_linears_int8(self.model, probe)
            progress(f"quantize {self.name} to int8 ({self.int8_linears} int8, {kept} fp32; TV from fp32 {self.int8_tv:.3f})", 1, 1, "")
        if self.device == "cpu" and self.torch_dtype == torch.float32:
            from app.engines.cpu_kernels import pack_linears

            self.packed_linears = pack_linears(self.model)  # what int8 left in fp32 (or the whole model)
        self.load_s = time.perf_counter() - t0
        self._final_norm = getattr(self.model.get_decoder(), "norm", None) if hasattr(self.model, "get_decoder") else None
        # decode states can return the final normed hidden states (the output layer's input): ReDrafter heads
        self.supports_hidden = self._final_norm is not None
        progress(f"load {self.name}", 1, 1, "")
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = cfg.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(int(i) for i in ids)

    def new_state(self) -> HFDecodeState:
        return HFDecodeState(self)

    @property
    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix [vocab, hidden] (ReDrafter heads embed their drafts with it)."""
        return self.model.get_input_embeddings().weight

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the output layer's weight, float32 [len(ids), hidden] (ReDrafter heads start from them).
        The packed CPU layer keeps no plain weight: then the tied input embedding, or the weights file, gives them."""
        w = getattr(self.model.get_output_embeddings(), "weight", None)
        if isinstance(w, torch.Tensor):
            return w[ids].float()
        if getattr(self.model.config, "tie_word_embeddings", False):
            return self.input_embeddings[ids].float()
        from safetensors import safe_open

        for f in sorted(self.folder.glob("*.safetensors")):
            with safe_open(str(f), "pt") as fh:
                if "lm_head.weight" in fh.keys():
                    return fh.get_slice("lm_head.weight")[:][ids].float()
        raise EngineError(f"engine {self.name}: no lm_head.weight in {self.folder}", fix=_repair_hint(self.manifest))

    @contextlib.contextmanager
    def hidden_states(self, on: bool):
        """Within the block, the final norm's outputs of every forward are appended to the yielded list (when `on`)."""
        box: list = []
        if not on:
            yield box
            return
        if self._final_norm is None:
            raise EngineError(f"engine {self.name}: its model has no final norm module to read hidden states from",
                              fix="ReDrafter heads need a Llama/Qwen-style model (model.model.norm)")
        handle = self._final_norm.register_forward_hook(lambda _m, _i, out: box.append(out))
        try:
            yield box
        finally:
            handle.remove()

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
