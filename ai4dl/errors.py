"""The failures ai4dl expects and explains: bad input, bad configuration, a missing table, a mismatched model.

They all derive from :class:`Ai4dlError`, so the CLI can print them in one line and exit 2, while anything else
(a bug, a crashed executor) keeps its traceback and exits 1. Each message names the file, key or column at
fault and what to do about it; the subclasses also derive from ``ValueError`` (or ``FileNotFoundError``) so
callers that caught those before still do.
"""

from __future__ import annotations


class Ai4dlError(Exception):
    """An expected failure with a message a user can act on."""


class ConfigError(Ai4dlError, ValueError):
    """A configuration file, key or value that does not fit the declared sections."""


class InputError(Ai4dlError, ValueError):
    """Source data that cannot be ingested as a whole (missing file, missing columns, unreadable format)."""


class MissingTableError(Ai4dlError, FileNotFoundError):
    """A stage needs a table that no earlier stage has written yet."""


class ModelError(Ai4dlError, ValueError):
    """A model directory that cannot be used, or a model that does not fit the table it is applied to."""


class SparkSetupError(Ai4dlError, RuntimeError):
    """The Spark environment cannot run ai4dl as started (e.g. Delta missing under spark-submit)."""


__all__ = ["Ai4dlError", "ConfigError", "InputError", "MissingTableError", "ModelError", "SparkSetupError"]
