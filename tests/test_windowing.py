"""Windows against a hand-computed pandas version; scaler statistics; gaps and out-of-order arrival."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from ai4dl.method.scaler import Scaler
from ai4dl.lake.schema import BRONZE, SILVER
from ai4dl.method.windowing import build_windows, container_windows

FEATURES = ("cpu_usage_cores", "mem_current")
T0 = datetime(2024, 1, 1)


def bronze_rows(spec):
    """spec: list of (pod, seconds_after_t0, cpu, mem)."""
    rows = []
    for pod, sec, cpu, mem in spec:
        ts = T0 + timedelta(seconds=sec)
        rows.append((pod, "svc", ts, 4.0, cpu * 1e9, cpu, cpu * 25, cpu * 24, mem, 1e10, mem / 1e8, mem * 0.9,
                     None, "f.csv", T0, ts.date()))
    return rows


def pandas_windows(pdf: pd.DataFrame, scaler: Scaler, n: int) -> pd.DataFrame:
    """The hand-computed reference: sort, scale, stack the n previous rows oldest first."""
    out = []
    for pod, g in pdf.sort_values("ts").groupby("pod_id"):
        z = scaler.transform(g[list(FEATURES)].to_numpy())
        for i in range(len(g)):
            hist = z[i - n : i].ravel().tolist() if i >= n else None
            out.append({"pod_id": pod, "step": i, "features": z[i].tolist(), "history": hist})
    return pd.DataFrame(out)


def test_windows_equal_pandas_version(spark):
    # p1 arrives out of order; p2 has fewer rows than the history
    spec = [("p1", 30, 3.0, 300.0), ("p1", 0, 1.0, 100.0), ("p1", 20, 2.5, 250.0), ("p1", 10, 2.0, 200.0),
            ("p1", 40, 3.5, 380.0), ("p2", 0, 0.5, 50.0), ("p2", 10, 0.7, 70.0)]
    bronze = spark.createDataFrame(bronze_rows(spec), BRONZE)
    scaler = Scaler.fit(bronze, FEATURES)
    silver = build_windows(bronze, scaler, n_history=2)
    assert silver.schema.fieldNames() == SILVER.fieldNames()
    got = silver.orderBy("pod_id", "step").toPandas()
    want = pandas_windows(bronze.toPandas(), scaler, 2)
    assert got["step"].tolist() == want["step"].tolist()
    for g, w in zip(got.itertuples(), want.itertuples()):
        np.testing.assert_allclose(g.features, w.features)
        if w.history is None:
            assert g.history is None and not g.has_full_history
        else:
            np.testing.assert_allclose(g.history, w.history)
            assert g.has_full_history
    assert got[got.pod_id == "p2"]["has_full_history"].tolist() == [False, False]  # kept, marked


def test_scaler_is_population_statistics(spark):
    spec = [("p", i * 10, float(v), 10.0) for i, v in enumerate([1, 2, 3, 4])]
    scaler = Scaler.fit(spark.createDataFrame(bronze_rows(spec), BRONZE), FEATURES)
    assert scaler.mean[0] == pytest.approx(2.5)
    assert scaler.scale[0] == pytest.approx(np.std([1, 2, 3, 4]))
    assert scaler.scale[1] == 1.0  # constant feature: scale 1, not a division by zero
    assert Scaler.from_json(scaler.to_json()) == scaler


def test_gap_starts_a_new_segment(spark):
    spec = [("p", s, 1.0 + i, 10.0 + i) for i, s in enumerate([0, 10, 20, 30, 1000, 1010, 1020])]
    bronze = spark.createDataFrame(bronze_rows(spec), BRONZE)
    scaler = Scaler.fit(bronze, FEATURES)
    rows = build_windows(bronze, scaler, 2, max_gap_seconds=60).orderBy("step").collect()
    assert [r["segment"] for r in rows] == [0, 0, 0, 0, 1, 1, 1]
    assert [r["has_full_history"] for r in rows] == [False, False, True, True, False, False, True]
    no_gap = build_windows(bronze, scaler, 2).orderBy("step").collect()
    assert [r["has_full_history"] for r in no_gap] == [False, False, True, True, True, True, True]


def test_bad_arguments(spark):
    bronze = spark.createDataFrame(bronze_rows([("p", 0, 1.0, 1.0)]), BRONZE)
    with pytest.raises(ValueError, match="n_history"):
        build_windows(bronze, Scaler.fit(bronze, FEATURES), 0)
    with pytest.raises(ValueError, match="lacks"):
        build_windows(bronze.drop("mem_current"), Scaler(FEATURES, (0.0, 0.0), (1.0, 1.0)), 2)


def test_spark_windows_are_the_kernel_run_per_container(spark):
    """The window stage's Spark rows are :func:`container_windows` on each container's ordered samples, the
    kernel the served model and the stream call: derived features restarted after a gap, a zero limit's
    window not labelled, arrival order irrelevant."""
    from ai4dl.lake.columns import BEHAVIOUR_FEATURES

    secs = [*range(0, 400, 10), *range(2000, 2300, 10)]  # a gap after 40 samples
    spec = [("p", s, 1.0 + (i % 7) * 0.4, 1e9 * (1 + (i % 5))) for i, s in enumerate(secs)]
    spec += [("q", s, 2.0 + (i % 3), 5e8 * (1 + i % 4)) for i, s in enumerate(range(0, 300, 30))]
    rows = bronze_rows(spec)
    rows[45] = rows[45][:9] + (0.0,) + rows[45][10:]  # p's 46th sample: a zero memory limit
    shuffled = [rows[i] for i in np.random.default_rng(3).permutation(len(rows))]
    bronze = spark.createDataFrame(shuffled, BRONZE)
    features = ("cpu_usage_cores", *BEHAVIOUR_FEATURES)
    scaler = Scaler(features, tuple(0.1 * i for i in range(len(features))), tuple(1.0 + i for i in range(len(features))))
    got = build_windows(bronze, scaler, n_history=3, max_gap_seconds=300).orderBy("pod_id", "step").toPandas()
    assert not got.loc[(got.pod_id == "p") & got.step.between(45, 48), "has_full_history"].any()
    for pod, g in pd.DataFrame(rows, columns=BRONZE.fieldNames()).groupby("pod_id"):
        g = g.sort_values("ts").reset_index(drop=True)
        seconds = ((g["ts"] - pd.Timestamp(T0)) / pd.Timedelta(seconds=1)).to_numpy()
        want = container_windows(g, seconds, scaler, 3, max_gap_seconds=300)
        mine = got[got.pod_id == pod].reset_index(drop=True)
        assert mine["step"].tolist() == list(range(len(g)))
        assert mine["segment"].tolist() == want.segment.tolist()
        assert mine["has_full_history"].tolist() == want.full.tolist()
        assert mine["history"].isna().tolist() == (~want.has_history).tolist()
        for i in range(len(g)):
            np.testing.assert_allclose(np.array(mine["features"][i], dtype=float), want.features[i], rtol=1e-12, equal_nan=True)
            if want.has_history[i]:
                np.testing.assert_allclose(np.array(mine["history"][i], dtype=float), want.history[i], rtol=1e-12, equal_nan=True)
    assert got[got.pod_id == "p"]["segment"].max() == 1
