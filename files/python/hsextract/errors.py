"""Exceptions that carry a message a user can act on.

Every error the project raises on bad input or configuration derives from `HsextractError`, so
the CLI can print it without a traceback and exit non-zero, and tests can assert on the text.
"""

from __future__ import annotations


class HsextractError(Exception):
    """An error whose message says what is wrong, where, and how to fix it."""

    exit_code = 2


class ConfigError(HsextractError):
    """A configuration value is invalid (architecture, layer ids, paths, parallelism...)."""


class UnsupportedArchitecture(ConfigError):
    """The model's architecture has no capture support."""


class LayerConfigError(ConfigError):
    """Auxiliary layer ids are out of range or malformed."""


class StagingError(HsextractError):
    """A staged dump is malformed or unreadable."""
