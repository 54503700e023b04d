"""The Databricks walkthrough notebook runs top to bottom on the DLaaS sample, inside the test's Spark session."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "ai4dl_walkthrough.py"
SEPARATOR = "# COMMAND ----------"


def _cells(text: str) -> list[list[str]]:
    cells, current = [], []
    for line in text.splitlines()[1:]:
        if line == SEPARATOR:
            cells.append(current)
            current = []
        else:
            current.append(line)
    cells.append(current)
    return [[line for line in cell if line.strip()] for cell in cells]


def test_notebook_cell_format():
    text = NOTEBOOK.read_text()
    assert text.splitlines()[0] == "# Databricks notebook source"
    cells = _cells(text)
    assert len(cells) > 10
    assert all(cell for cell in cells), "no empty cells"
    md = [cell for cell in cells if cell[0] == "# MAGIC %md"]
    assert md, "at least one markdown cell"
    for cell in md:  # a markdown cell is MAGIC lines only
        assert all(line == "# MAGIC" or line.startswith("# MAGIC ") for line in cell), cell
    code = [cell for cell in cells if not cell[0].startswith("# MAGIC")]
    assert all(not line.startswith("# MAGIC") for cell in code for line in cell)
    compile(text, str(NOTEBOOK), "exec")  # a Databricks source file is valid Python


@pytest.mark.slow
def test_notebook_runs_on_dlaas_sample(dlaas_sample, reference_model, spark, tmp_path, monkeypatch):
    env = {
        "AI4DL_LAKE_ROOT": tmp_path / "lake",
        "AI4DL_MODELS": tmp_path / "models",
        "AI4DL_REPORT_DIR": tmp_path / "report",
        "AI4DL_SAMPLE": dlaas_sample,
        "AI4DL_REFERENCE_MODEL": reference_model,
        "AI4DL_EPOCHS": 3,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))

    ns = runpy.run_path(str(NOTEBOOK), run_name="__main__")

    assert ns["WALKTHROUGH_DONE"] is True
    assert ns["spark"] is spark, "the notebook must reuse the active session"
    assert ns["USE_SAMPLE"] and ns["HAVE_REFERENCE"]
    phases = spark.read.format("delta").load(str(tmp_path / "lake" / "silver" / "phases"))
    assert phases.count() == 204
    assert phases.select("model_id").distinct().first()["model_id"] == ns["reference_model"].model_id
    assert -1.0 <= ns["MODEL_ARI"] <= 1.0
    assert (tmp_path / "models" / "reference" / "v0001").is_dir()
    assert (tmp_path / "models" / "ai4dl" / "v0001").is_dir()
    assert not ns["phase_stats_pdf"].empty
    assert not ns["policy_summary"].empty
    report = tmp_path / "report" / "index.html"
    assert report.is_file() and ns["report_path"] == report
    assert (tmp_path / "report" / "trace_phases.png").is_file()


@pytest.mark.slow
def test_notebook_names_its_tables_in_a_catalog_when_given_a_schema(dlaas_sample, reference_model, tmp_path):
    """With the `schema` widget set (here its environment variable), the notebook's own session has a persistent
    catalog: every table named there and the BI views persisted, read back by name in the BI cell."""
    import os
    import subprocess
    import sys

    root = NOTEBOOK.parents[1]
    env = {**os.environ, "AI4DL_LAKE_ROOT": str(tmp_path / "lake"), "AI4DL_MODELS": str(tmp_path / "models"),
           "AI4DL_REPORT_DIR": str(tmp_path / "report"), "AI4DL_SAMPLE": str(dlaas_sample),
           "AI4DL_REFERENCE_MODEL": str(reference_model), "AI4DL_EPOCHS": "2", "AI4DL_SCHEMA": "walk",
           "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(NOTEBOOK)], cwd=root, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "walkthrough done" in out.stdout
    assert "views `walk`.ai4dl_phase_stats, `walk`.ai4dl_phase_summary" in out.stdout
    assert (tmp_path / "lake" / "_metastore" / "metastore_db").is_dir()
