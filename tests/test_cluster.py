"""The pipeline on a real Spark standalone cluster (master + one 2-core worker on loopback) gives the local results.

The cluster application runs in a separate driver process (``python -m tests.standalone``): this test process
already hosts the session's local[2] SparkContext, and a JVM holds only one. Its Delta tables are on local disk
(the worker is on the same machine) and are read back with the in-process session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from ai4dl import stages
from tests.standalone import RESULT_PREFIX, StandaloneCluster, driver_command, kill_group

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DRIVER_TIMEOUT = 600.0  # generous: a loaded CI box; an idle one needs a fraction


@pytest.fixture()
def cluster(tmp_path):
    c = StandaloneCluster(tmp_path / "cluster", cores=2, memory="2g")
    try:
        c.start(timeout=120.0)
        yield c
    finally:
        c.stop()


def _start_driver(cluster: StandaloneCluster, lake, models, sample, reference, cwd) -> subprocess.Popen:
    log = open(cluster.base / "driver.log", "w")
    cmd = driver_command(cluster.master_url, lake, models, sample, reference)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cluster.env, cwd=cwd, start_new_session=True)
    finally:
        log.close()  # the child holds its own descriptor


def _finish_driver(cluster: StandaloneCluster, proc: subprocess.Popen) -> dict:
    try:
        proc.wait(timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_group(proc)  # the driver's JVM and Python workers too, also on timeout
    text = (cluster.base / "driver.log").read_text(errors="replace")
    if proc.returncode != 0:
        pytest.fail(f"cluster driver failed (rc={proc.returncode}):\n{text[-6000:]}\n{cluster.log_text()}")
    results = [line[len(RESULT_PREFIX) :] for line in text.splitlines() if line.startswith(RESULT_PREFIX)]
    assert results, f"the driver printed no result:\n{text[-6000:]}"
    return json.loads(results[-1])


def _completed_app(cluster: StandaloneCluster, app_id: str, timeout: float = 30.0) -> dict:
    def done(state: dict) -> bool:
        return any(a["id"] == app_id for a in state.get("completedapps", []))

    state = cluster.wait_for(done, f"application {app_id} to complete", timeout)
    return next(a for a in state["completedapps"] if a["id"] == app_id)


def _local_run(spark, cfg, sample, reference) -> None:
    """The same stages in-process, local[2], as tests/test_reference.py runs them."""
    model_dir = stages.import_reference_model(cfg, spark, path=str(reference)).details["path"]
    stages.ingest(cfg, spark, input=str(sample))
    stages.window(cfg, spark, scaler_from_model=model_dir)
    stages.label(cfg, spark, model=model_dir)
    stages.policies(cfg, spark)


def _table(spark, root, rel: str) -> pd.DataFrame:
    return spark.read.format("delta").load(f"{root}/{rel}").toPandas()


def test_pipeline_on_standalone_cluster_matches_local(dlaas_sample, reference_model, project_root, spark, cfg, cluster, tmp_path):
    t0 = time.time()
    cluster_lake, cluster_models = tmp_path / "cluster_lake", tmp_path / "cluster_models"
    driver = _start_driver(cluster, cluster_lake, cluster_models, dlaas_sample, reference_model, project_root)
    try:
        _local_run(spark, cfg, dlaas_sample, reference_model)  # in-process local[2] meanwhile: the two applications overlap
    except BaseException:
        kill_group(driver)
        raise
    out = _finish_driver(cluster, driver)
    t_runs = time.time() - t0

    # It really ran on the cluster: the standalone master, an executor process on the worker, the venv's Python.
    assert out["master"] == cluster.master_url
    assert out["executors"] >= 1 and out["executors_at_end"] >= 1, out
    assert out["task_pythons"] == [sys.prefix], out
    app = _completed_app(cluster, out["app_id"])
    assert app["name"] == "ai4dl-cluster-test" and app["state"] == "FINISHED", app
    executor_logs = list((cluster.base / "work" / out["app_id"]).glob("*/stderr"))
    assert executor_logs, f"no executor ran for {out['app_id']}\n{cluster.log_text()}"
    assert any("Finished task" in p.read_text(errors="replace") for p in executor_logs), cluster.log_text()
    assert out["inserted"] > 0 and out["labelled"]

    local_root, cluster_root = cfg.lake.root, str(cluster_lake)

    # phases: same phase per step, distances equal up to float noise
    key = ["pod_id", "step"]
    mine = _table(spark, local_root, "silver/phases")[[*key, "phase", "distance"]].sort_values(key).reset_index(drop=True)
    theirs = _table(spark, cluster_root, "silver/phases")[[*key, "phase", "distance"]].sort_values(key).reset_index(drop=True)
    assert len(mine) == len(theirs) == 204
    pd.testing.assert_frame_equal(mine[[*key, "phase"]], theirs[[*key, "phase"]])
    both = mine["distance"].notna()
    assert (both == theirs["distance"].notna()).all()
    np.testing.assert_allclose(theirs["distance"][both], mine["distance"][both], rtol=0, atol=1e-9)
    assert mine["phase"].notna().sum() > 0

    # policy replay: every column of every (pod, policy, resource)
    replay_local = _table(spark, local_root, "gold/policy_replay")
    replay_cluster = _table(spark, cluster_root, "gold/policy_replay")
    assert list(replay_local.columns) == list(replay_cluster.columns)
    assert len(replay_local) > 0
    order = list(replay_local.columns)
    replay_local = replay_local.sort_values(order).reset_index(drop=True)
    replay_cluster = replay_cluster.sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(replay_cluster, replay_local, check_exact=False, rtol=1e-9, atol=1e-9)
    print(f"cluster + local runs {t_runs:.0f}s, with the comparison {time.time() - t0:.0f}s")
