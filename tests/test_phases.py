"""Train -> label on a small generated fleet: UDF equals driver, determinism, refinement, clear refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from pyspark.sql import functions as F

from ai4dl import lake as lk
from ai4dl.clustering import adjusted_rand_index, fit_centers
from ai4dl.ingest import ingest
from ai4dl.labelling import label_arrays, run_label
from ai4dl.model import ModelError, PhaseModel
from ai4dl.synthetic import generate_fleet, write_fleet
from ai4dl.training import refine_model, train_model
from ai4dl.windowing import run_window


@pytest.fixture(scope="module")
def fleet(spark, test_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    cfg = copy.deepcopy(test_config)
    cfg["lake"].update(root=str(root / "lake"), models=str(root / "models"))
    cfg["train"].update(epochs=6, sample_size=3000, max_per_container=200, k=4, batch_size=64)
    write_fleet(generate_fleet(spark, 16, 150, seed=3, partitions=2), str(root / "raw"), "parquet")
    ingest(spark, cfg, str(root / "raw"), fmt="parquet")
    run_window(spark, cfg)
    model, report = train_model(spark, cfg, log=lambda *_: None)
    run_label(spark, cfg, model)
    return cfg, model, report


def test_training_report_and_quality(fleet):
    _, model, report = fleet
    assert model.k == 4 and model.crbm.n_hidden == 10 and model.n_history == 3
    assert 0 < report["crbm_windows"] <= 3000
    assert "holdout_ari" in report and -1.0 <= report["holdout_ari"] <= 1.0
    assert model.info["training_data"]["containers"] > 0


def test_udf_encoding_equals_driver_encoding(spark, fleet):
    cfg, model, _ = fleet
    silver = lk.read(spark, cfg, "silver").where("has_full_history").orderBy("pod_id", "step").limit(300).toPandas()
    phases = lk.read(spark, cfg, "phases").where("phase is not null").toPandas().set_index(["pod_id", "step"])
    x = np.stack(silver["features"].to_numpy())
    cond = np.stack(silver["history"].to_numpy())
    phase, dist, h = label_arrays(model, x, cond)
    got = phases.loc[list(zip(silver.pod_id, silver.step))]
    assert got["phase"].astype(int).tolist() == phase.tolist()
    np.testing.assert_allclose(got["distance"].to_numpy(dtype=float), dist, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.stack(got["activations"].to_numpy()), h, rtol=1e-9, atol=1e-12)


def test_pandas_and_arrow_engines_agree(spark, fleet):
    from ai4dl.labelling import label

    cfg, model, _ = fleet
    silver = lk.read(spark, cfg, "silver")
    pods = [r[0] for r in silver.select("pod_id").distinct().orderBy("pod_id").limit(2).collect()]
    part = silver.where(F.col("pod_id").isin(pods))
    a = label(part, model, engine="arrow").orderBy("pod_id", "step").toPandas()
    p = label(part, model, engine="pandas").orderBy("pod_id", "step").toPandas()
    assert a["phase"].isna().tolist() == p["phase"].isna().tolist()
    assert a["phase"].dropna().astype(int).tolist() == p["phase"].dropna().astype(int).tolist()
    for x, y in zip(a["activations"], p["activations"]):
        assert (x is None and y is None) or np.allclose(x, y)
    with pytest.raises(ValueError, match="engine"):
        label(part, model, engine="numba")


def test_steps_without_history_get_no_phase(spark, fleet):
    cfg, _, _ = fleet
    rows = lk.read(spark, cfg, "phases").where("step < 3").select("phase", "activations", "distance").collect()
    assert rows and all(r["phase"] is None and r["activations"] is None and r["distance"] is None for r in rows)


def test_training_is_deterministic_under_a_seed(spark, fleet):
    cfg, model, _ = fleet
    again, _ = train_model(spark, cfg, log=lambda *_: None)
    assert again.model_id == model.model_id


def test_refinement_splits_one_phase_and_keeps_the_others(spark, fleet):
    cfg, model, _ = fleet
    refined = refine_model(spark, cfg, model, phase=0, k_sub=2)
    assert refined.refinements[0][1] == (0, 4) and refined.phase_ids == [0, 1, 2, 3, 4]
    silver = lk.read(spark, cfg, "silver").where("has_full_history").limit(2000).toPandas()
    x, cond = np.stack(silver["features"].to_numpy()), np.stack(silver["history"].to_numpy())
    before, _, _ = label_arrays(model, x, cond)
    after, _, _ = label_arrays(refined, x, cond)
    assert np.array_equal(before[before != 0], after[before != 0])
    assert set(after[before == 0]) <= {0, 4}
    with pytest.raises(ValueError, match="already refined"):
        refine_model(spark, cfg, refined, phase=0, k_sub=2)


def test_label_refuses_a_model_for_other_features(spark, fleet):
    cfg, model, _ = fleet
    from ai4dl.crbm import CRBMWeights
    from ai4dl.scaler import Scaler

    w = model.crbm
    other = PhaseModel(
        Scaler(("a",) * 0 + tuple(f"x{i}" for i in range(w.n_visible)), model.scaler.mean, model.scaler.scale),
        CRBMWeights(**w.as_dict()), model.centers,
    )
    with pytest.raises(ModelError, match="features"):
        run_label(spark, cfg, other)


def test_k_larger_than_distinct_points(spark):
    df = spark.createDataFrame([([0.1, 0.2],), ([0.1, 0.2],), ([0.3, 0.4],)], "activations array<double>")
    with pytest.raises(ValueError, match="only 2 distinct points"):
        fit_centers(df, 3, seed=1)


def test_adjusted_rand_index():
    assert adjusted_rand_index(np.array([[5, 0], [0, 5]])) == pytest.approx(1.0)
    assert adjusted_rand_index(np.array([[0, 5], [5, 0]])) == pytest.approx(1.0)  # labels are arbitrary
    from sklearn.metrics import adjusted_rand_score

    truth = [0] * 4 + [1] * 3 + [2] * 5
    pred = [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0, 2]
    table = np.zeros((3, 3), dtype=int)
    for p, t in zip(pred, truth):
        table[p, t] += 1
    assert adjusted_rand_index(table) == pytest.approx(adjusted_rand_score(truth, pred))


def test_torch_distributor_data_parallel_training(spark):
    """Two ranks on local cores through Spark's TorchDistributor: parameters averaged each epoch, error falls."""
    from ai4dl.training import train_distributed

    rng = np.random.default_rng(0)
    regime = rng.integers(0, 2, size=2000)
    x = rng.normal(size=(2000, 4)) * 0.3 + regime[:, None] * 2.0
    cond = np.repeat(x, 2, axis=1) + rng.normal(size=(2000, 8)) * 0.1
    params = dict(n_hidden=3, cd_k=1, epochs=4, batch_size=64, learning_rate=0.01, patience=5, min_delta=0.0, seed=5, device="cpu")
    result = train_distributed(x, cond, params, processes=2, log=lambda *_: None)
    assert result.weights.W.shape == (3, 4) and result.weights.n_history == 2
    assert result.epochs_run == 4 and result.epoch_errors[-1] < result.epoch_errors[0]
