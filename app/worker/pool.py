"""The worker's engine pool: a model used by several lanes is loaded once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from app.core.errors import EngineError
from app.core.events import ProfileReady, Progress
from app.engines.base import check_tokenizers
from app.engines.registry import load_tokenizer, open_engine, resolve

__all__ = ["EnginePool"]


class EnginePool:
    """Engines keyed by (name, device, dtype). `emit` receives Progress events for conversion and loading.

    Tests may `put` ready-made engines (tiny random models) under a name.
    """

    def __init__(self, emit: Callable[[object], None] = lambda e: None) -> None:
        self.emit = emit
        self._engines: dict[tuple[str, str | None, str | None], Any] = {}
        self._tokenizers: dict[str, object] = {}
        self._profiles: dict[int, Any] = {}  # id(engine) -> CostProfile

    def put(self, name: str, engine, device: str | None = None, dtype: str | None = None) -> None:
        self._engines[(name, device, dtype)] = engine

    def _progress(self, name: str):
        last = [0.0]

        def cb(task: str, done: float, total: float, unit: str) -> None:
            now = time.monotonic()
            if done >= total or now - last[0] > 0.1:  # at most ~10 events/s
                last[0] = now
                self.emit(Progress(task=f"{name}: {task}", done=done, total=total, unit=unit))

        return cb

    def get(self, name: str, device: str | None = None, dtype: str | None = None):
        if (name, device, dtype) in self._engines:
            return self._engines[(name, device, dtype)]
        put = self._engines.get((name, None, None))  # an engine `put` (or loaded) without device/dtype
        if put is not None and dtype in (None, getattr(put, "dtype", None)):
            return put
        manifest = resolve(name)
        eng = open_engine(manifest, device, dtype, self._progress(name), tokenizer=self._tokenizers.get(name))
        self._engines[(name, device, dtype)] = eng
        return eng

    def tokenizer(self, name: str):
        """The tokenizer alone (no weights loaded), for compatibility checks before loading a draft; None when the
        engine's backend has no local tokenizer."""
        for key, eng in self._engines.items():
            if key[0] == name:
                return eng.tokenizer
        if name not in self._tokenizers:
            self._tokenizers[name] = load_tokenizer(resolve(name), self._progress(name))
        return self._tokenizers[name]

    def get_draft(self, target_name: str, target, draft_name: str, device=None, dtype=None):
        """Load a draft for `target` after checking (on tokenizers only) that they share a vocabulary."""
        ttok = target.tokenizer
        dtok = self.tokenizer(draft_name)
        if ttok is not None and dtok is not None:
            check_tokenizers(target_name, ttok, draft_name, dtok)
        draft = self.get(draft_name, device, dtype)
        if draft.vocab_size != target.vocab_size:
            raise EngineError(
                f"draft {draft_name!r} has {draft.vocab_size} logits, target {target_name!r} has {target.vocab_size}",
                fix="pick a draft model of the same family as the target",
            )
        return draft

    def profile(self, engine, measure: bool = True, force: bool = False):
        """The engine's cost profile (app.core.costs): kept in memory, read from the cache, or — with `measure` —
        measured now with Progress events (once per engine, precision, device, weights and machine). None for
        engines without step-by-step states (TensorRT-LLM) or when not cached and `measure` is False."""
        from app.speculative.costs import cached_or_measure, profilable, profile_key

        if not profilable(engine):
            return None
        p = None if force else self._profiles.get(id(engine))
        if p is None:
            from app.core.costs import load_profile

            p = None if force else load_profile(profile_key(engine))
            if p is None and (measure or force):
                p, _ = cached_or_measure(engine, force=True, progress=self._progress(engine.name))
            if p is not None:
                self._profiles[id(engine)] = p
                self.emit(ProfileReady(p))
        return p
