"""MLflow tracking of ``train``: a local file store under tmp_path; the logged pyfunc model labels raw traces
exactly as the batch ``label`` stage does. ai4dl imports and explains itself without MLflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from ai4dl import stages
from ai4dl.tracking import metrics


@pytest.mark.slow
def test_train_logs_run_and_pyfunc_labels_like_the_batch_stage(cfg, spark, lake, dlaas_sample, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    import mlflow.pyfunc

    store = (tmp_path / "mlruns").as_uri()
    c = cfg.replace(train={"epochs": 3, "k": 3, "k_range": [3, 3], "sample_size": 1000},
                    mlflow={"enabled": True, "tracking_uri": store, "experiment": "dlaas"})
    stages.ingest(c, spark, input=str(dlaas_sample))
    stages.window(c, spark)
    logged = stages.train(c, spark).details["mlflow"]
    stages.label(c, spark)

    run = mlflow.MlflowClient(store).get_run(logged["run_id"])
    assert run.data.params["train.k"] == "3" and run.data.params["window.n_history"] == "3"
    assert run.data.params["model_id"] == run.data.tags["ai4dl.model_id"]
    assert run.data.metrics["crbm_reconstruction_error"] > 0
    assert {"crbm_epochs", "k_silhouette", "k_inertia", "crbm_epoch_error"} <= set(run.data.metrics)
    assert len(mlflow.MlflowClient(store).get_metric_history(run.info.run_id, "crbm_epoch_error")) >= 1
    files = {f.path for f in mlflow.MlflowClient(store).list_artifacts(run.info.run_id, "report")}
    assert files == {"report/train_report.json", "report/train_curve.png"}

    model = mlflow.pyfunc.load_model(logged["model_uri"])
    raw = pd.read_csv(dlaas_sample).sample(frac=1.0, random_state=3)  # any row order, several containers
    got = model.predict(raw)
    assert list(got.index) == list(raw.index)
    batch = lake.read("phases").selectExpr("pod_id", "cast(ts as long) as ts", "step", "phase").toPandas()
    merged = got.astype({"ts": "int64"}).merge(batch, on=["pod_id", "ts"], suffixes=("_pyfunc", "_batch"), validate="1:1")
    assert len(merged) == len(raw) == 204
    assert (merged["step_pyfunc"] == merged["step_batch"]).all()
    assert merged["phase_batch"].isna().sum() == 4 * 3  # the first n_history steps of each container
    assert merged["phase_pyfunc"].astype("Int64").equals(merged["phase_batch"].astype("Int64"))

    # the policy model fitted on those phases is logged too: its knobs, service level and held-out scores
    fitted = stages.policies(c.replace(policies={"interval_steps": 5}), spark).details
    run = mlflow.MlflowClient(store).get_run(fitted["mlflow"]["run_id"])
    model = fitted["model"]
    assert run.data.tags["ai4dl.policy_model_id"] == model.model_id and run.data.params["phase_model_id"] == model.phase_model_id
    assert run.data.params["knob.vpa.mem"] == str(model.knobs["vpa"]["mem"])
    assert run.data.params["deployed.cpu"] == model.best["cpu"]
    assert "vpa.mem.oom_kills_per_100h" in run.data.metrics and "prev.step.rules.cpu.savings_vs_static" in run.data.metrics
    files = {f.path for f in mlflow.MlflowClient(store).list_artifacts(run.info.run_id, "policy_model")}
    assert files == {"policy_model/manifest.json", "policy_model/policy.json"}


def test_metrics_include_ari_and_k_report():
    class Stub:  # metrics() reads info only
        info = {"crbm": {"reconstruction_error": 0.5, "epoch_errors": [0.9, 0.5]}}

    got = metrics(Stub(), {"holdout_ari": 0.8, "holdout_steps": 100, "crbm_epochs": 2, "k_report": [[3, 0.4, 10.0], [4, 0.3, 8.0]]})
    assert ("holdout_ari", 0.8, 0) in got and ("k_silhouette", 0.3, 4) in got and ("k_inertia", 10.0, 3) in got
    assert [v for n, v, _ in got if n == "crbm_epoch_error"] == [0.9, 0.5]


def test_ai4dl_works_without_mlflow(project_root: Path):
    """With MLflow not importable: the package, the CLI and the pyfunc module import; enabling tracking is
    one ConfigError line. And nothing imports MLflow unless tracking is enabled."""
    code = """
import sys
sys.modules["mlflow"] = None  # as if not installed
import ai4dl.stages, ai4dl.cli, ai4dl.tracking, ai4dl.method.pyfunc
from ai4dl.config import load_config
from ai4dl.errors import ConfigError
cfg = load_config(None, ["mlflow.enabled=true"])
try:
    ai4dl.tracking.require_mlflow()
except ConfigError as exc:
    print("ERROR", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project_root, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("ERROR mlflow.enabled is true but MLflow is not installed: pip install 'ai4dl[mlflow]'")
    assert "\n" not in line
    lazy = subprocess.run([sys.executable, "-c", "import sys, ai4dl.stages, ai4dl.cli, ai4dl.tracking; print('mlflow' in sys.modules)"],
                          capture_output=True, text=True, cwd=project_root, timeout=120)
    assert lazy.stdout.strip() == "False", lazy.stderr
