"""hsextract: EAGLE-3 hidden-state extraction from a serving SGLang engine.

The package is split into a pure core (capture, drain, formats, client logic) and thin adapters
at the edges (the SGLang hook, HTTP, files, the CLI), so that the core can be tested without a
server and the adapters stay small.
"""

__version__ = "0.1.0"
