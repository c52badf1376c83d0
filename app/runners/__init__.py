"""Lane runners that wrap another implementation instead of our speculative loop (app.speculative.loop): a
library's own `generate` (transformers' assisted generation and prompt lookup, llama-cpp-python's prompt lookup,
TensorRT-LLM) or a server's token stream (any OpenAI-compatible server). Each reports raw facts to the one
accounting (app.core.accounting); the drafters, verifier, trees and policies stay in app.speculative."""
