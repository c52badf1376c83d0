"""`remote:<engine>`: a target served by llama-server, vLLM, SGLang or trtllm-serve (backend = "openai"), with the
server's own speculative config; its lanes stream over HTTP (app.runners.openai_stream)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, engine_arg, register

__all__ = ["Remote", "KIND"]


@dataclass(frozen=True)
class Remote(SetupBase):
    """A served model: what the server does (plain decoding, or its own draft model / EAGLE / n-gram config)."""

    prefix = "remote"

    engine: str = engine_arg("lane", backends=("openai",), example="vllm-llama-3.1-405b-eagle3",
                             help="a backend = \"openai\" engine: an OpenAI-compatible server and its model")


def build(setup: Remote, env):
    from app.runners.openai_stream import RemoteRunner

    return RemoteRunner(env.engine(setup.engine))


KIND = register(SetupKind(Remote, "remote server", "a model served over HTTP (llama-server, vLLM, SGLang, trtllm-serve), its own speculative config",
                          build))
