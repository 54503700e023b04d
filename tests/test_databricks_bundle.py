"""The Databricks Asset Bundle (databricks.yml), checked without a workspace: its jobs against Databricks' own typed
models of a bundle's resources (databricks-bundles, generated from the bundle schema), its tasks against the jobs/
entry points and the CLI, its notebook parameters against the notebook's widgets, and the wheel it installs."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from ai4dl.cli import PIPELINE_STAGES, _parser
from ai4dl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "databricks.yml"
NOTEBOOK = ROOT / "notebooks" / "ai4dl_walkthrough.py"
# A bundle's top-level keys (Databricks' bundle schema); anything else is a typo the CLI would reject.
TOP_LEVEL = {"bundle", "variables", "artifacts", "resources", "targets", "include", "workspace", "sync",
             "permissions", "presets", "experimental", "run_as", "scripts", "python"}
VARIABLE = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")


@pytest.fixture(scope="module")
def bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text())


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def _substitute(text: str, bundle: dict) -> str:
    """A variable's default, or a sample value for a required one (as `--var` would give it)."""
    samples = {"lake_root": "s3://bucket/ai4dl/lake", "input": "/Volumes/main/ai4dl/files/traces"}
    text = VARIABLE.sub(lambda m: str(bundle["variables"][m.group(1)].get("default", samples.get(m.group(1)))), text)
    return text.replace("${workspace.file_path}", str(ROOT)).replace("${bundle.target}", "dev")


def test_the_bundle_is_well_formed_and_every_variable_is_declared_and_used(bundle):
    assert set(bundle) <= TOP_LEVEL and bundle["bundle"]["name"] == "ai4dl"
    used = {m for s in _strings(bundle["resources"]) for m in VARIABLE.findall(s)}
    declared = set(bundle["variables"])
    assert used <= declared, used - declared
    assert declared <= used | {m for s in _strings(bundle["variables"]) for m in VARIABLE.findall(s)}, declared - used
    assert set(bundle["targets"]) == {"dev", "prod"} and bundle["targets"]["dev"]["default"] is True
    wheel = bundle["artifacts"]["ai4dl_wheel"]
    assert wheel["type"] == "whl" and wheel["build"] == "python -m build --wheel"


def test_every_job_is_a_valid_databricks_job(bundle):
    from databricks.bundles.jobs import Job

    jobs = bundle["resources"]["jobs"]
    assert set(jobs) == {"ai4dl_pipeline", "ai4dl_walkthrough"}
    for name, job in jobs.items():
        parsed = Job.from_dict(job)  # unknown or misspelt fields fail here, as `databricks bundle validate` would
        assert parsed.tasks, name
        for task in job["tasks"]:
            assert task["libraries"] == [{"whl": "./dist/*.whl"}]  # the wheel the artifact builds


def test_the_pipeline_job_runs_the_jobs_entry_points_in_pipeline_order_with_valid_configs(bundle):
    tasks = bundle["resources"]["jobs"]["ai4dl_pipeline"]["tasks"]
    order = [t["task_key"] for t in tasks]
    assert order == [s for s in PIPELINE_STAGES if s in order] and order[0] == "ingest" and order[-1] == "report"
    for before, task in zip(tasks, tasks[1:]):
        assert task["depends_on"] == [{"task_key": before["task_key"]}]
    parser = _parser()
    for task in tasks:
        python_file = ROOT / task["spark_python_task"]["python_file"]
        assert python_file.is_file() and python_file.parent.name == "jobs"
        verb = task["task_key"]
        assert f'main(["{verb}", *sys.argv[1:]])' in python_file.read_text()
        argv = [_substitute(a, bundle) for a in task["spark_python_task"]["parameters"]]
        args = parser.parse_args([verb, *argv])
        cfg = load_config(args.conf, args.overrides)  # every --set is a known key with a valid value
        assert cfg.lake.namespace == "`main`.`ai4dl`" and cfg.lake.root == "s3://bucket/ai4dl/lake"
        assert cfg.spark.ivy_cache is None  # Databricks brings Delta; nothing is resolved there


def test_the_notebook_job_sets_exactly_the_notebooks_widgets(bundle):
    task = bundle["resources"]["jobs"]["ai4dl_walkthrough"]["tasks"][0]
    notebook = ROOT / task["notebook_task"]["notebook_path"]
    assert notebook == NOTEBOOK and notebook.read_text().startswith("# Databricks notebook source")
    widgets = re.findall(r'^\w+ = (?:int\()?param\("(\w+)"', notebook.read_text(), flags=re.M)
    assert widgets and set(task["notebook_task"]["base_parameters"]) == set(widgets)
    assert all(isinstance(v, str) for v in task["notebook_task"]["base_parameters"].values())  # widgets are text


@pytest.mark.slow
def test_the_wheel_the_bundle_installs_carries_the_library_and_no_spark_of_its_own(tmp_path):
    """`python -m build --wheel`, as the bundle's artifact runs it: package data included, and no pyspark or
    delta-spark among its unconditional requirements (a cluster's runtime brings its own)."""
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    wheel = next(tmp_path.glob("ai4dl-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {"ai4dl/cli.py", "ai4dl/lake/log4j2.properties", "ai4dl/lake/readonly/ReadOnlyExtension.java"} <= names
    requires = [ln for ln in metadata.splitlines() if ln.startswith("Requires-Dist:")]
    spark = [r for r in requires if re.match(r"Requires-Dist: (pyspark|delta-spark)\b", r)]
    assert spark and all('extra == "spark"' in r for r in spark), spark
    assert any(r.startswith("Requires-Dist: torch") for r in requires)
