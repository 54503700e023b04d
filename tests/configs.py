"""Configurations of the tests' own lakes."""

from __future__ import annotations

from pathlib import Path


def config_under(test_config, root, **sections):
    """``test_config`` with its lake, models and report under the folder ``root`` (and ``sections`` replaced):
    a test's own lake, sharing the session's Spark settings."""
    root = Path(root)
    return test_config.replace(lake={"root": str(root / "lake"), "models": str(root / "models")},
                               report={"dir": str(root / "report")}, **sections)
