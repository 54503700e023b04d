"""The README's two commands: what each installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def test_the_demo_installs_only_what_it_needs():
    """`make demo` brings Java and the Python environment; the test-only system packages come with `make test`."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]
    dry = {target: subprocess.run(["make", "-n", target], cwd=root, capture_output=True, text=True, check=True).stdout
           for target in ("demo", "test")}
    assert "ai4dl demo" in dry["demo"] and "java" in dry["demo"]
    assert "chromium" not in dry["demo"] and "prometheus" not in dry["demo"]
    assert "chromium" in dry["test"] and "prometheus" in dry["test"]
