"""Speculative decoding: drafters, the pure verifier, and the per-step loop."""
