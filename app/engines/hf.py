"""Hugging Face transformers backend (PyTorch, CPU or CUDA; float32 or bfloat16)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from app.core.errors import EngineError
from app.engines.base import TokenizerMixin
from app.engines.cache import ProgressFn, prepare
from app.engines.registry import EngineManifest

__all__ = ["HFEngine", "HFSession", "resolve_device", "resolve_dtype", "load_tokenizer"]

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
        raise EngineError(f"unknown dtype {dtype!r}", fix="use float32, bfloat16 or float16")
    return _DTYPES[dtype]


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


class HFSession:
    """One sequence's DynamicCache on an HFEngine."""

    def __init__(self, engine: HFEngine) -> None:
        from transformers import DynamicCache

        self.engine = engine
        self.cache = DynamicCache(config=engine.model.config)
        self._len = 0

    @property
    def length(self) -> int:
        return self._len

    @torch.inference_mode()
    def forward(self, ids: list[int], last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append `ids` to the cache; float32 logits [len(ids), vocab], or of the last `keep` positions
        ([1, vocab] when last_only)."""
        e = self.engine
        x = torch.tensor([ids], dtype=torch.long, device=e.device)  # [1, n]
        pos = torch.arange(self._len, self._len + len(ids), device=e.device)
        out = e.model(
            input_ids=x,
            past_key_values=self.cache,
            use_cache=True,
            cache_position=pos,
            logits_to_keep=1 if last_only else keep,
        )
        self._len += len(ids)
        return out.logits[0].float()  # [n or 1, vocab]

    def crop(self, length: int) -> None:
        """Drop cached tokens beyond `length` (transformers 5.x: crop takes a negative count)."""
        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length} outside 0..{self._len}")
        if length < self._len:
            self.cache.crop(length - self._len)
            self._len = length


class HFEngine(TokenizerMixin):
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
        self.torch_dtype = resolve_dtype(dtype or manifest.dtype, self.device)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        self.folder = prepare(manifest, progress)
        t0 = time.perf_counter()
        self.tokenizer = tokenizer or load_tokenizer(self.folder)
        progress(f"load {self.name}", 0, 1, "")
        try:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=self.torch_dtype).to(self.device)
        except Exception as e:
            raise EngineError(
                f"cannot load engine {self.name} from {self.folder}: {type(e).__name__}: {e}",
                fix=f"the cache may be corrupt: run `python -m app convert {self.name} --force`",
            ) from None
        self.model.eval()
        cfg = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.packed_linears = 0
        if self.device == "cpu" and self.torch_dtype == torch.float32:
            from app.engines.cpu_kernels import pack_linears

            self.packed_linears = pack_linears(self.model)
        self.load_s = time.perf_counter() - t0
        progress(f"load {self.name}", 1, 1, "")
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = cfg.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(int(i) for i in ids)


    def new_session(self) -> HFSession:
        return HFSession(self)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    @classmethod
    def from_model(cls, name: str, model, tokenizer, chat_template: bool = False) -> HFEngine:
        """Wrap an already-built model (tests: tiny random models built from a config)."""
        self = cls.__new__(cls)
        self.manifest = EngineManifest(name=name, path=None, backend="hf", source_kind="hf_dir", source=("<memory>",), chat_template=chat_template)
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = str(next(model.parameters()).device)
        self.torch_dtype = next(model.parameters()).dtype
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        self.folder = None
        self.load_s = 0.0
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.packed_linears = 0
        eos = model.generation_config.eos_token_id if model.generation_config else model.config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        return self
