"""Shared fixtures: one local[2] Delta SparkSession for the whole test session, fresh lakes, the reference data,
and a writer of small DLaaS-shaped CSV exports. Test modules share helpers only through these fixtures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from tests.configs import config_under

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "reference"


def _require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared reference data not present: {path}")
    return path


def pytest_configure(config):
    """Delta's JARs fetched once before any pytest-xdist worker starts, so two workers on a fresh machine do
    not both run Ivy into the same cache (a no-op once the classpath is recorded)."""
    if hasattr(config, "workerinput"):
        return
    from ai4dl.lake.session import delta_jars

    delta_jars(ROOT / ".cache" / "ivy")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def dlaas_sample() -> Path:
    """The real DLaaS traces published with AI4DL (4 containers, 204 rows); skips when ../shared is absent."""
    return _require_shared(SHARED / "dlaas_sample.csv")


@pytest.fixture(scope="session")
def reference_model() -> Path:
    """The original AI4DL pretrained model as JSON; skips when ../shared is absent."""
    return _require_shared(SHARED / "reference_model.json")


@pytest.fixture(scope="session")
def test_config(tmp_path_factory):
    from ai4dl.config import load_config

    lake = tmp_path_factory.mktemp("lake")
    return load_config(
        None,
        [
            "spark.master=local[2]",
            "spark.shuffle_partitions=2",
            "spark.driver_memory=2g",
            f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}",
            f"lake.root={lake}",
            f"lake.models={lake / 'models'}",
        ],
    )


@pytest.fixture(scope="session")
def spark(test_config):
    from ai4dl.lake.session import get_spark

    session = get_spark(test_config)
    yield session
    session.stop()


@pytest.fixture()
def cfg(tmp_path, test_config):
    """A fresh configuration (tables, models and report under tmp_path) sharing the session's Spark settings."""
    return config_under(test_config, tmp_path)


@pytest.fixture()
def lake(spark, cfg):
    """The :class:`ai4dl.lake.tables.Lake` handle of ``cfg``'s fresh lake."""
    from ai4dl.lake.tables import Lake

    return Lake.for_config(spark, cfg)


class Export:
    """Rows of a DLaaS-shaped CSV export: one good row, variations of it by column, and a writer."""

    HEADER = [
        "timestamp", "service", "pod.id", "cpu.num.cores", "cpu.usage", "cpu.usage.cores", "cpu.usage.pct",
        "cpu.usage.pct.container.requested", "mem.current", "mem.limit", "mem.usage.pct", "mem.working.set",
    ]
    GOOD = ["1565962220", "svc", "p1", "4", "756911788", "0.041", "1.03", "1", "2478080", "5242880000", "0.05", "2478080"]

    def row(self, **changes: str) -> list[str]:
        """The good row with some columns changed (``pod_id="x"`` changes ``pod.id``)."""
        r = dict(zip(self.HEADER, self.GOOD))
        r.update({k.replace("_", "."): v for k, v in changes.items()})
        return [r[h] for h in self.HEADER]

    def write(self, path: Path, rows: list[list[str]], header: list[str] | None = None) -> str:
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(self.HEADER if header is None else header)
            w.writerows(rows)
        return str(path)


@pytest.fixture(scope="session")
def export() -> Export:
    return Export()
