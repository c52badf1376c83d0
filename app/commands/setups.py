"""`python -m app setups`: the setup grammar and every kind's parameters, read from the registry."""

from __future__ import annotations

__all__ = ["add_parser", "run", "describe_setups"]


def add_parser(sub) -> None:
    st = sub.add_parser("setups", help="list the setup kinds (the --setup grammar) and their parameters")
    st.set_defaults(func=run)


def describe_setups() -> str:
    """Every registered setup kind with its parameters (read from the registry)."""
    from app.core.setups import grammar, kinds

    out = [grammar(), ""]
    for k in kinds():
        out.append(f"{k.prefix}: {k.summary}")
        if k.engine is not None:
            out.append(f"  {k.engine.metavar:<8}  {k.engine.help} (role: {k.engine.role})")
        for p in k.params:
            rng = ""
            if p.choices:
                rng = " | ".join(p.choices)
            elif p.min is not None and p.max is not None:
                rng = f"[{p.format(p.min)}, {p.format(p.max)}{')' if p.max_exclusive else ']'}"
            default = p.unset or "unset" if p.default is None else p.format(p.default)
            out.append(f"  {p.name:<9} {p.type.__name__:<5} default {default}; {rng}  {p.help}".rstrip())
    return "\n".join(out)


def run(args) -> int:
    print(describe_setups())
    return 0
