"""SpecDeck: compare LLM decoding setups (speculative decoding above all) side by side."""

from app.core import threads

__version__ = "0.1.0"

threads.apply()  # SPECDECK_THREADS: before anything here imports torch (app.core.threads)
