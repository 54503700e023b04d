"""Train -> label on a small generated fleet: UDF equals driver, determinism, refinement, clear refusals."""

from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import numpy as np
import pytest
from pyspark.sql import functions as F

from ai4dl import stages
from ai4dl.errors import InputError
from ai4dl.lake.tables import Lake
from ai4dl.method.clustering import adjusted_rand_index, fit_centers, fit_centers_local
from ai4dl.method.labelling import forward_decode, label_arrays, label_windows, step_costs, switch_cost
from ai4dl.method.model import ModelError, PhaseModel
from ai4dl.method.split import ContainerSplit
from ai4dl.method.training import PhaseEstimator, refine
from ai4dl.method.windowing import silver_scaler
from ai4dl.traces.synthetic import generate_fleet, write_fleet
from tests.configs import config_under


@pytest.fixture(scope="module")
def fleet(spark, test_config, tmp_path_factory):
    """16 generated containers ingested, windowed, trained on and labelled through the stages."""
    root = tmp_path_factory.mktemp("fleet")
    cfg = config_under(
        test_config, root,
        train={"epochs": 6, "sample_size": 3000, "max_per_container": 200, "k": 4, "batch_size": 64},
    )
    write_fleet(generate_fleet(spark, 16, 150, seed=3, partitions=2), str(root / "raw"), "parquet")
    stages.ingest(cfg, spark, input=str(root / "raw"), fmt="parquet")
    stages.window(cfg, spark)
    trained = stages.train(cfg, spark)
    stages.label(cfg, spark)
    return SimpleNamespace(cfg=cfg, lake=Lake.for_config(spark, cfg), model=trained.details["model"],
                           report=trained.details["report"], model_dir=trained.details["path"])


def test_training_report_and_quality(fleet):
    model, report = fleet.model, fleet.report
    assert model.k == 4 and model.crbm.n_hidden == fleet.cfg.train.n_hidden == 32 and model.n_history == 3
    assert 0 < report["crbm_windows"] <= 3000
    assert "holdout_ari" in report and report["holdout_steps"] > 0
    assert model.info["training_data"]["containers"] > 0
    assert model.info["params"]["train"] == {**fleet.cfg.to_dict()["train"]}  # the whole training section


def test_udf_encoding_equals_driver_encoding(spark, fleet):
    lake, model = fleet.lake, fleet.model
    silver = lake.read("silver").where("has_full_history").orderBy("pod_id", "step").limit(300).toPandas()
    phases = lake.read("phases").where("phase is not null").toPandas().set_index(["pod_id", "step"])
    x = np.stack(silver["features"].to_numpy())
    cond = np.stack(silver["history"].to_numpy())
    _, _, h = label_arrays(model, x, cond)
    # the stage decodes each container causally (label.smoothing forward): each container's first steps here,
    # decoded on the driver, are what it wrote for them (a causal decoder's prefix does not depend on the rest)
    assert lake.properties("phases")["ai4dl.decoding"] == "forward"
    assert lake.properties("phases")["ai4dl.decoding_latency"] == "0 steps"  # causal: decided at each step
    assert lake.properties("phases")["ai4dl.switch_penalty"] == "0.25"  # the default over a classifier's nats
    # over the costs of the model's phase classifier (-log p), as every trained model's decoders read them
    assert model.classifier is not None
    d2, costs = step_costs(np.asarray(model.centers, dtype=np.float64), model.classifier, h)
    phase = np.zeros(len(h), dtype=np.int64)
    for pod in silver["pod_id"].unique():
        rows = np.flatnonzero(silver["pod_id"].to_numpy() == pod)
        phase[rows] = forward_decode(costs[rows], switch_cost(model, "forward"))[0]
    dist = np.sqrt(d2[np.arange(len(h)), phase])
    got = phases.loc[list(zip(silver.pod_id, silver.step))]
    assert got["phase"].astype(int).tolist() == phase.tolist()
    np.testing.assert_allclose(got["distance"].to_numpy(dtype=float), dist, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.stack(got["activations"].to_numpy()), h, rtol=1e-9, atol=1e-12)


def test_pandas_and_arrow_engines_agree(spark, fleet):
    lake, model = fleet.lake, fleet.model
    silver = lake.read("silver")
    pods = [r[0] for r in silver.select("pod_id").distinct().orderBy("pod_id").limit(2).collect()]
    part = silver.where(F.col("pod_id").isin(pods))
    a = label_windows(part, model, engine="arrow").orderBy("pod_id", "step").toPandas()
    p = label_windows(part, model, engine="pandas").orderBy("pod_id", "step").toPandas()
    assert a["phase"].isna().tolist() == p["phase"].isna().tolist()
    assert a["phase"].dropna().astype(int).tolist() == p["phase"].dropna().astype(int).tolist()
    for x, y in zip(a["activations"], p["activations"]):
        assert (x is None and y is None) or np.allclose(x, y)
    # decoded: both engines label, then decode each container over its steps in time order
    a = label_windows(part, model, engine="arrow", decoding="forward").orderBy("pod_id", "step").toPandas()
    p = label_windows(part, model, engine="pandas", decoding="forward").orderBy("pod_id", "step").toPandas()
    assert a["phase"].isna().tolist() == p["phase"].isna().tolist()
    assert a["phase"].dropna().astype(int).tolist() == p["phase"].dropna().astype(int).tolist()
    np.testing.assert_allclose(a["distance"].to_numpy(dtype=float), p["distance"].to_numpy(dtype=float), rtol=1e-9)
    assert a.drop(columns=["phase", "distance", "activations"]).equals(p.drop(columns=["phase", "distance", "activations"]))
    with pytest.raises(ValueError, match="engine"):
        label_windows(part, model, engine="numba")
    with pytest.raises(ValueError, match="engine"):
        label_windows(part, model, engine="numba", decoding="forward")


def test_steps_without_history_get_no_phase(spark, fleet):
    lake = fleet.lake
    rows = lake.read("phases").where("step < 3").select("phase", "activations", "distance").collect()
    assert rows and all(r["phase"] is None and r["activations"] is None and r["distance"] is None for r in rows)


def test_training_is_deterministic_under_a_seed(spark, fleet):
    lake, model = fleet.lake, fleet.model
    silver = lake.read("silver")
    scaler, n_history = silver_scaler(lake.properties("silver"))
    again = PhaseEstimator.from_model(model).fit(silver, scaler, n_history, log=None)  # retrained from itself
    assert again.model_id == model.model_id and again.classifier is not None
    # a model trained before the phase classifier existed records no classifier keys: retrained as it was, none
    params = model.info["params"]
    older = {**params, "train": {k: v for k, v in params["train"].items() if not k.startswith("classifier_")}}
    assert PhaseEstimator.from_model(model.with_info(params=older)).train.classifier_units == 0
    # ...and one trained before the classifier's lead learnt the offline phases of the same step: lead 0
    unled = {**params, "train": {k: v for k, v in params["train"].items() if k != "classifier_lead"}}
    assert PhaseEstimator.from_model(model.with_info(params=unled)).train.classifier_lead == 0
    assert model.info["classifier"]["target_lead"] == params["train"]["classifier_lead"]


def test_refinement_splits_one_phase_and_keeps_the_others(spark, fleet):
    lake, model = fleet.lake, fleet.model
    training = ContainerSplit.of(fleet.cfg.window).training(lake.read("silver").where("has_full_history"))
    refined = refine(model, training, phase=0, k_sub=2, seed=fleet.cfg.train.seed)
    assert refined.refinements[0][1] == (0, 4) and refined.phase_ids == [0, 1, 2, 3, 4]
    silver = lake.read("silver").where("has_full_history").limit(2000).toPandas()
    x, cond = np.stack(silver["features"].to_numpy()), np.stack(silver["history"].to_numpy())
    # a refined model labels by nearest (sub-)centre, without the classifier: against the same model's nearest
    # centres, every other phase keeps its steps
    assert refined.classifier is None and "classifier" not in refined.info
    before, _, _ = label_arrays(dataclasses.replace(model, classifier=None), x, cond)
    after, _, _ = label_arrays(refined, x, cond)
    assert np.array_equal(before[before != 0], after[before != 0])
    assert set(after[before == 0]) <= {0, 4}
    with pytest.raises(ModelError, match="already refined"):
        refine(refined, training, phase=0, k_sub=2, seed=fleet.cfg.train.seed)


def test_label_refuses_a_model_for_other_features(spark, fleet, tmp_path):
    model = fleet.model
    from ai4dl.method.crbm import CRBMWeights
    from ai4dl.method.model import save
    from ai4dl.method.scaler import Scaler

    w = model.crbm
    other = PhaseModel(
        Scaler(("a",) * 0 + tuple(f"x{i}" for i in range(w.n_visible)), model.scaler.mean, model.scaler.scale),
        CRBMWeights(**w.as_dict()), model.centers,
    )
    other_dir = save(other, tmp_path / "other")
    with pytest.raises(ModelError, match="features"):
        stages.label(fleet.cfg, spark, model=str(other_dir))


def test_k_larger_than_distinct_points(spark):
    df = spark.createDataFrame([([0.1, 0.2],), ([0.1, 0.2],), ([0.3, 0.4],)], "activations array<double>")
    with pytest.raises(InputError, match="only 2 distinct points"):
        fit_centers(df, 3, seed=1)
    with pytest.raises(InputError, match="only 2 distinct points"):
        fit_centers_local(np.array([[0.1, 0.2], [0.1, 0.2], [0.3, 0.4]]), 3, seed=1)
    with pytest.raises(InputError, match="no activations"):
        fit_centers_local(np.full((4, 2), np.nan), 2, seed=1)


def test_driver_and_spark_kmeans_find_the_same_centres_in_the_same_order(spark):
    """The engines differ in starts (k-means++ vs k-means||) but must agree where the clusters are clear, in
    the stable order phase ids come from; non-finite rows are left out as null ones are in Spark."""
    rng = np.random.default_rng(0)
    blobs = np.concatenate([rng.normal(c, 0.05, size=(60, 3)) for c in ([0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 1, 1])])
    local = fit_centers_local(np.vstack([blobs, [[np.nan, 0, 0]]]), 4, seed=5, restarts=3)
    df = spark.createDataFrame([(row.tolist(),) for row in blobs], "activations array<double>")
    np.testing.assert_allclose(local, fit_centers(df, 4, seed=5, restarts=3), atol=1e-9)
    assert local[:, 0].tolist() == sorted(local[:, 0].tolist())


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
    from ai4dl.method.training import train_distributed

    rng = np.random.default_rng(0)
    regime = rng.integers(0, 2, size=2000)
    x = rng.normal(size=(2000, 4)) * 0.3 + regime[:, None] * 2.0
    cond = np.repeat(x, 2, axis=1) + rng.normal(size=(2000, 8)) * 0.1
    params = dict(n_hidden=3, cd_k=1, epochs=4, batch_size=64, learning_rate=0.01, patience=5, min_delta=0.0, seed=5, device="cpu")
    result = train_distributed(x, cond, params, processes=2, log=lambda *_: None)
    assert result.weights.W.shape == (3, 4) and result.weights.n_history == 2
    assert result.epochs_run == 4 and result.epoch_errors[-1] < result.epoch_errors[0]


def test_phase_quality_on_hand_made_labels():
    from ai4dl.method.quality import phase_quality

    truth = ["steady"] * 6 + ["warmup"] * 4
    perfect = phase_quality(truth, [3] * 6 + [1] * 4)
    assert perfect["ari"] == pytest.approx(1.0) and perfect["nmi"] == pytest.approx(1.0)
    mixed = phase_quality(truth, [3, 3, 3, 3, 1, 1, 1, 1, 1, None])  # one unlabelled step left out
    assert mixed["steps"] == 9
    assert mixed["behaviours"]["steady"] == {"steps": 6, "phase": 3, "purity": 4 / 6}
    assert mixed["behaviours"]["warmup"] == {"steps": 3, "phase": 1, "purity": 1.0}
    assert 0 < mixed["ari"] < 1


def test_sample_is_chosen_by_keys_as_over_whole_windows(fleet, spark):
    """The sample picked from keys alone (then read with its arrays) is the one the random order over the whole
    windows picks, in the same order: at most per_container windows of each container, at most size in all."""
    from pyspark.sql import Window

    from ai4dl.method.training import stratified_sample

    windows = spark.read.format("delta").load(fleet.lake.path("silver")).where("has_full_history")
    size, per_container, seed = 500, 40, 11  # 16 containers x 40 = 640 capped, then 500
    order = Window.partitionBy("pod_id").orderBy(F.rand(seed), "ts")
    whole = (windows.withColumn("_r", F.row_number().over(order)).where(F.col("_r") <= per_container).drop("_r")
             .orderBy(F.xxhash64("pod_id", "ts", F.lit(seed))).limit(size))
    expected = [(r["pod_id"], r["ts"], list(r["features"])) for r in whole.collect()]
    got = [(r["pod_id"], r["ts"], list(r["features"])) for r in stratified_sample(windows, size, per_container, seed).collect()]
    assert got == expected
    assert len(got) == size
    per_pod = {}
    for pod, _, _ in got:
        per_pod[pod] = per_pod.get(pod, 0) + 1
    assert max(per_pod.values()) <= per_container
