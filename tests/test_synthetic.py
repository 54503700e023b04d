"""The synthetic fleet: shape, determinism, validity, distinguishable behaviours, argument checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ai4dl.lake.schema import GENERATED_SOURCE
from ai4dl.traces.synthetic import BEHAVIOURS, generate_container, generate_fleet, write_fleet

N, T = 40, 300
START, INTERVAL = 1_700_000_000, 30


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["pod.id", "timestamp"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def fleet(spark):
    df = generate_fleet(spark, N, T, seed=7, services=4, start=START, interval_seconds=INTERVAL)
    return df, _sorted(df.toPandas())


def _fractions(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(
        cpu_frac=pdf["cpu.usage.cores"] / pdf["cpu.num.cores"],
        mem_frac=pdf["mem.current"] / pdf["mem.limit"],
    )


def test_behaviour_names():
    assert BEHAVIOURS == ("warmup", "mem_load_unload", "steady", "cpu_spikes_mem_growing", "mem_heavy_variable_cpu")


def test_shape_and_schema(fleet):
    df, pdf = fleet
    assert df.schema == GENERATED_SOURCE
    assert list(pdf.columns) == [f.name for f in GENERATED_SOURCE.fields]
    assert len(pdf) == N * T
    assert pdf["pod.id"].nunique() == N
    assert (pdf.groupby("pod.id").size() == T).all()
    assert set(pdf["behaviour"]) == set(BEHAVIOURS)
    firsts = pdf.groupby("pod.id")["behaviour"].first()
    assert (firsts == "warmup").all()
    # several behaviours per life, even on a short trace
    runs = pdf.groupby("pod.id")["behaviour"].apply(lambda s: int((s != s.shift()).sum()))
    assert runs.min() >= 3
    assert set(pdf["service"]) == {f"service{i}" for i in range(1, 5)}
    assert pdf["pod.id"].iloc[0] == "gen-7-000000"


def test_generate_container_dtypes():
    one = generate_container(0, 50, 7, 4, START, INTERVAL)
    assert list(one.columns) == [f.name for f in GENERATED_SOURCE.fields]
    assert one["timestamp"].dtype == np.int64
    text = ("timestamp", "service", "pod.id", "behaviour")
    assert all(one[c].dtype == np.float64 for c in one.columns if c not in text)
    assert len(generate_container(5, 1, 7, 4, START, INTERVAL)) == 1


def test_deterministic(spark, fleet):
    _, pdf = fleet
    # same seed, other partitioning: identical data
    again = generate_fleet(spark, N, T, seed=7, start=START, interval_seconds=INTERVAL, partitions=3)
    again = _sorted(again.toPandas())
    pd.testing.assert_frame_equal(pdf, again)
    other = generate_container(0, T, 8, 4, START, INTERVAL)
    assert not np.allclose(pdf["cpu.usage.cores"].iloc[:T].to_numpy(), other["cpu.usage.cores"].to_numpy())
    assert other["pod.id"].iloc[0] == "gen-8-000000"


def test_container_independent_of_fleet(fleet):
    _, pdf = fleet
    got = pdf[pdf["pod.id"] == "gen-7-000003"].reset_index(drop=True)
    want = generate_container(3, T, 7, 4, START, INTERVAL)
    pd.testing.assert_frame_equal(got, want)
    pd.testing.assert_frame_equal(generate_container(3, T, 7, 4, START, INTERVAL), want)


def test_valid(fleet):
    _, pdf = fleet
    metrics = pdf.drop(columns=["service", "pod.id", "behaviour"])
    assert not metrics.isna().any().any()
    assert (metrics.to_numpy() >= 0).all()
    assert (pdf["mem.current"] <= pdf["mem.limit"]).all()
    assert (pdf["mem.working.set"] <= pdf["mem.current"]).all()
    assert (pdf["mem.working.set"] >= 0.84 * pdf["mem.current"] - 4096).all()
    assert (pdf["cpu.usage.cores"] <= pdf["cpu.num.cores"]).all()
    assert (pdf["cpu.usage.cores"] > 0).all()
    assert set(pdf["cpu.num.cores"]) <= {1.0, 2.0, 4.0, 8.0, 16.0}
    gib = pdf["mem.limit"] / 2**30
    assert ((gib >= 2) & (gib <= 32)).all()
    # the export's formulas
    np.testing.assert_allclose(pdf["cpu.usage.pct"], 100 * pdf["cpu.usage.cores"] / pdf["cpu.num.cores"], atol=0.006)
    np.testing.assert_allclose(pdf["mem.usage.pct"], 100 * pdf["mem.current"] / pdf["mem.limit"], atol=0.006)
    np.testing.assert_allclose(pdf["cpu.usage"], pdf["cpu.usage.cores"] * INTERVAL * 1e9, rtol=0.03)
    ratio = pdf["cpu.usage.pct.container.requested"] / pdf["cpu.usage.pct"]
    big = pdf["cpu.usage.pct"] >= 5
    assert ratio[big].between(0.95, 1.0).all()
    assert abs(ratio[big].median() - 0.975) < 0.005
    assert (pdf["cpu.usage.pct.container.requested"] <= pdf["cpu.usage.pct"] + 0.006).all()
    # keys and regular sampling
    assert not pdf.duplicated(["pod.id", "timestamp"]).any()
    assert (pdf.groupby("pod.id")["timestamp"].diff().dropna() == INTERVAL).all()
    assert (pdf["timestamp"] >= START).all()


def test_behaviours_distinguishable(fleet):
    _, pdf = fleet
    stats = _fractions(pdf).groupby("behaviour")[["cpu_frac", "mem_frac"]].agg(["mean", "std"])
    cpu, mem = stats["cpu_frac"], stats["mem_frac"]
    # memory-heavy holds the most memory, warm-up the least
    assert mem.loc["mem_heavy_variable_cpu", "mean"] > 0.65
    for b in ("steady", "mem_load_unload", "cpu_spikes_mem_growing", "warmup"):
        assert mem.loc["mem_heavy_variable_cpu", "mean"] > mem.loc[b, "mean"] + 0.25
    assert mem.loc["warmup", "mean"] < mem.loc["steady", "mean"]
    # steady works its cores hardest, load/unload least; both quietly
    assert cpu.loc["steady", "mean"] > cpu.loc["mem_heavy_variable_cpu", "mean"]
    assert cpu.loc["steady", "mean"] > cpu.loc["mem_load_unload", "mean"] + 0.25
    assert cpu.loc["mem_load_unload", "mean"] < 0.25
    # load/unload swings memory, spikes and warm-up swing CPU
    assert mem.loc["mem_load_unload", "std"] > 1.5 * mem.loc["steady", "std"]
    assert cpu.loc["cpu_spikes_mem_growing", "std"] > 1.5 * cpu.loc["steady", "std"]
    assert cpu.loc["warmup", "std"] > cpu.loc["steady", "std"]


def test_within_phase_shapes():
    """Spiky phases spike, growing memory grows, steady stays put (per container, long trace)."""
    pdf = _fractions(pd.concat([generate_container(i, 1000, 3, 4, START, INTERVAL) for i in range(20)]))
    run = (pdf["behaviour"] != pdf["behaviour"].shift()).cumsum()
    grew, steady_cv = [], []
    for _, g in pdf.groupby(run):
        if len(g) < 30:
            continue
        b = g["behaviour"].iloc[0]
        if b == "cpu_spikes_mem_growing":
            grew.append(g["mem_frac"].iloc[-5:].mean() > g["mem_frac"].iloc[:5].mean())
            assert g["cpu_frac"].max() > 3 * g["cpu_frac"].median()
        elif b == "steady":
            steady_cv.append(g["mem_frac"].std() / g["mem_frac"].mean())
    assert grew and np.mean(grew) > 0.9
    assert steady_cv and np.median(steady_cv) < 0.05


def test_write_fleet(spark, tmp_path):
    df = generate_fleet(spark, 3, 20, seed=5, partitions=1)
    names = [f.name for f in GENERATED_SOURCE.fields]
    for fmt in ("csv", "parquet", "delta"):
        path = str(tmp_path / fmt)
        write_fleet(df, path, fmt)
        if fmt == "csv":
            first = open(next((tmp_path / fmt).glob("part-*.csv"))).readline().strip()
            assert first.split(",") == names
            back = spark.read.option("header", True).csv(path).toPandas()
            # integral columns come out as integers, like the reference export
            assert all(v.isdigit() for v in back["mem.limit"]) and all(v.isdigit() for v in back["cpu.usage"])
            assert len(back) == 60
        else:
            if fmt == "delta":
                assert (tmp_path / fmt / "_delta_log").is_dir()
            # a Delta table's data files are plain parquet; reading them skips the (slow) first snapshot load
            back = spark.read.parquet(path)
            assert back.count() == 60
        assert list(back.columns) == names
    with pytest.raises(ValueError):
        write_fleet(df, str(tmp_path / "x"), "json")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"containers": 0},
        {"containers": -3},
        {"steps": 0},
        {"services": 0},
        {"interval_seconds": 0},
        {"partitions": -1},
    ],
)
def test_bad_arguments(spark, kwargs):
    args = {"containers": 2, "steps": 5, **kwargs}
    with pytest.raises(ValueError):
        generate_fleet(spark, **args)


def test_bad_container_arguments():
    with pytest.raises(ValueError):
        generate_container(0, 0, 7, 4, START, INTERVAL)
    with pytest.raises(ValueError):
        generate_container(-1, 10, 7, 4, START, INTERVAL)
    with pytest.raises(ValueError):
        generate_container(0, 10, 7, 0, START, INTERVAL)
    with pytest.raises(ValueError):
        generate_container(0, 10, 7, 4, START, 0)
