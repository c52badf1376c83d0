"""User-facing errors: one clear message naming the problem and the fix."""

from __future__ import annotations

__all__ = ["SpecDeckError", "SetupError", "EngineError", "VocabMismatchError", "WorkerDiedError"]


class SpecDeckError(Exception):
    """An error caused by the user's input or environment; printed without a traceback.

    Args:
        message: what went wrong, naming the file/engine/value involved.
        fix: what the user should do about it (optional).
    """

    def __init__(self, message: str, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message

    def __reduce__(self):  # picklable across the worker boundary
        return (type(self), (self.message, self.fix))


class SetupError(SpecDeckError):
    """A malformed setup string or an out-of-range parameter."""


class EngineError(SpecDeckError):
    """An engine that cannot be found, fetched, verified, converted or loaded."""


class VocabMismatchError(EngineError):
    """Draft and target do not share a tokenizer."""


class WorkerDiedError(SpecDeckError):
    """The worker process exited while work was in flight."""
