"""`trtllm:<engine>`: a TensorRT-LLM engine with the speculative config of its manifest (CUDA, lazy import)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, engine_arg, register

__all__ = ["TRTLLM", "KIND"]


@dataclass(frozen=True)
class TRTLLM(SetupBase):
    """A TensorRT-LLM lane: the engine's manifest holds the target and its speculative config."""

    prefix = "trtllm"

    engine: str = engine_arg("lane", backends=("trtllm",), example="llama-3.1-8b-eagle3",
                             help="a backend = \"trtllm\" engine (its manifest holds the speculative config)")


def build(setup: TRTLLM, env):
    from app.runners.trtllm_generate import runner_for

    return runner_for(env.engine(setup.engine))


KIND = register(SetupKind(TRTLLM, "TensorRT-LLM", "a TensorRT-LLM engine with its manifest's speculative config", build))
