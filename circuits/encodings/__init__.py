"""Registered encodings: every module here is imported with the package and registers its blocks
(``circuits.blocks.register``); add one by adding a module (docs/circuits.md)."""
from circuits.blocks import discover

discover(__name__, __path__)
