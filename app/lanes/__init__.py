"""Setup types: one module per kind of lane (see app.core.setups for the registry and how to add one).

Each module declares its setup dataclass (parameters, label, engines) and how to build its lane runner, and
registers itself in one line. Modules import only app.core at import time (the GUI reads them without torch);
`build` imports the speculative loop or a backend lazily, in the worker.
"""
