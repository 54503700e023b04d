"""One local[2] Delta SparkSession for the whole test session, and the shared reference data."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "reference"
DLAAS_SAMPLE = SHARED / "dlaas_sample.csv"
REFERENCE_MODEL = SHARED / "reference_model.json"


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
    from ai4dl.session import get_spark

    session = get_spark(test_config)
    yield session
    session.stop()


@pytest.fixture()
def lake(tmp_path, test_config):
    """A fresh lake config (tables under tmp_path) sharing the session's Spark settings."""
    import copy

    cfg = copy.deepcopy(test_config)
    cfg["lake"]["root"] = str(tmp_path / "lake")
    cfg["lake"]["models"] = str(tmp_path / "models")
    cfg["report"]["dir"] = str(tmp_path / "report")
    return cfg


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared reference data not present: {path}")
    return path
