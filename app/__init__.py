"""SpecDeck: compare LLM decoding setups (speculative decoding above all) side by side."""

__version__ = "0.1.0"
