"""Exception types used across searchloop; every message names the bad value and the fix."""

from __future__ import annotations


class SearchloopError(Exception):
    """Base class for errors a user can act on (bad input, missing artifact, misconfiguration)."""


class ConfigError(SearchloopError, ValueError):
    """A configuration file or override is invalid; the message lists every problem at once."""


class DataError(SearchloopError, ValueError):
    """An input data file (corpus, benchmark, predictions) is malformed; the message names file and line."""


class ArtifactError(SearchloopError):
    """An artifact directory is missing, incomplete (no manifest) or inconsistent."""


class StoppedError(SearchloopError):
    """A run stopped on purpose (a training-health alarm or the start-policy gate fired): retrying cannot help."""
