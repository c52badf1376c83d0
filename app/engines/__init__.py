"""Backend adapters behind one protocol (`base.Engine`), and the manifest registry."""
