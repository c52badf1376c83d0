"""Plain data shared by every layer: events, setups, metrics, errors (stdlib only)."""
