"""The worker process that owns the engines, its messages, the client and the lane scheduler (no Qt)."""
