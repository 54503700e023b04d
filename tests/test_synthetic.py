"""The synthetic fleet: shape, determinism, validity, distinguishable behaviours, argument checks."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from ai4dl.lake.schema import GENERATED_SOURCE
from ai4dl.traces import training_loop
from ai4dl.traces.synthetic import BEHAVIOURS, PROFILES, generate_container, generate_fleet, write_fleet

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


# ------------------------------------------------------------------------------------- profiles, training-loop

TL = "training-loop"


def _digest(df: pd.DataFrame) -> str:
    """SHA-256 of a frame's column names and raw values (strings joined), independent of pandas' hashing."""
    h = hashlib.sha256()
    for c in df.columns:
        h.update(c.encode())
        v = df[c].to_numpy()
        h.update("\x1f".join(v).encode() if v.dtype == object else v.tobytes())
    return h.hexdigest()


def test_default_profile_unchanged():
    """The ai4dl profile draws the same numbers in the same order as before profiles existed (a frozen fleet
    was generated with it): digests computed with the generator at commit 00c08b4."""
    want = [
        "58394057bd38aa7bde9aaf7101e78dc353a24f2916f1e44ebb33f534e9d122c4",
        "f81fb98cc1788725b60d371f0086accbf33e8de67b988f18cef565b828d3ab17",
        "b78a0175cca15a8d3b0be36d95b57be2541bf4cf12469b641789db46172ce268",
        "b13949d14d77a23a7a6695eb716ada3a43b05930ab76ef6f520dd48d8ea47a05",
    ]
    for i, digest in enumerate(want):
        assert _digest(generate_container(i, 300, 7, 4, START, INTERVAL)) == digest
        assert _digest(generate_container(i, 300, 7, 4, START, INTERVAL, profile="ai4dl")) == digest


def test_unknown_profile():
    assert PROFILES == ("ai4dl", TL)
    for call in (lambda: generate_container(0, 10, 7, 4, START, INTERVAL, profile="nope"),
                 lambda: generate_fleet(None, 2, 5, profile="nope")):  # checked before Spark is touched
        with pytest.raises(ValueError, match="ai4dl, training-loop"):
            call()


def test_profile_config_and_cli():
    from ai4dl.cli import _overrides, _parser
    from ai4dl.config import ConfigError, GenerateConfig, load_config

    assert GenerateConfig().profile == "ai4dl"
    assert load_config(overrides=[f"generate.profile={TL}"]).generate.profile == TL
    with pytest.raises(ConfigError, match="generate.profile"):
        load_config(overrides=["generate.profile=nope"])
    assert f"generate.profile={TL}" in _overrides(_parser().parse_args(["generate", "--profile", TL]))


@pytest.fixture(scope="module")
def loop_fleet() -> pd.DataFrame:
    """16 training-loop containers of 4 services, 600 steps (5 hours at 30 s)."""
    return _fractions(pd.concat([generate_container(i, 600, 11, 4, START, INTERVAL, profile=TL) for i in range(16)],
                                ignore_index=True))


def _runs(pdf: pd.DataFrame) -> pd.DataFrame:
    """Runs of one behaviour per container: pod, behaviour, length, whether the trace cut it short."""
    key = (pdf["behaviour"] != pdf["behaviour"].shift()) | (pdf["pod.id"] != pdf["pod.id"].shift())
    runs = pdf.assign(run=key.cumsum()).groupby("run").agg(
        pod=("pod.id", "first"), behaviour=("behaviour", "first"), length=("behaviour", "size"))
    runs["last"] = runs["pod"] != runs["pod"].shift(-1)
    return runs


def test_training_loop_valid(loop_fleet):
    pdf = loop_fleet.drop(columns=["cpu_frac", "mem_frac"])
    assert list(pdf.columns) == [f.name for f in GENERATED_SOURCE.fields]
    assert pdf["timestamp"].dtype == np.int64
    text = ("timestamp", "service", "pod.id", "behaviour")
    assert all(pdf[c].dtype == np.float64 for c in pdf.columns if c not in text)
    metrics = pdf.drop(columns=["service", "pod.id", "behaviour"])
    assert not metrics.isna().any().any()
    assert (metrics.to_numpy() >= 0).all()
    assert (pdf["mem.current"] % 4096 == 0).all() and (pdf["mem.working.set"] % 4096 == 0).all()
    assert (pdf["mem.current"] <= pdf["mem.limit"]).all()
    assert (pdf["mem.working.set"] <= pdf["mem.current"]).all()
    assert (pdf["cpu.usage.cores"] <= pdf["cpu.num.cores"]).all()
    assert (pdf["cpu.usage.cores"] > 0).all()
    assert set(pdf["cpu.num.cores"]) <= {1.0, 2.0, 4.0, 8.0, 16.0}
    np.testing.assert_allclose(pdf["cpu.usage.pct"], 100 * pdf["cpu.usage.cores"] / pdf["cpu.num.cores"], atol=0.006)
    np.testing.assert_allclose(pdf["mem.usage.pct"], 100 * pdf["mem.current"] / pdf["mem.limit"], atol=0.006)
    np.testing.assert_allclose(pdf["cpu.usage"], pdf["cpu.usage.cores"] * INTERVAL * 1e9, rtol=0.03)
    assert not pdf.duplicated(["pod.id", "timestamp"]).any()
    assert (pdf.groupby("pod.id")["timestamp"].diff().dropna() == INTERVAL).all()
    assert (pdf["timestamp"] >= START).all() and pdf["timestamp"].groupby(pdf["pod.id"]).first().nunique() > 1
    assert set(pdf["service"]) == {f"service{i}" for i in range(1, 5)}
    # rare outliers: a handful of memory jumps (>= 8 % above both neighbours after the warm-up), not a pattern
    mem = pdf.groupby("pod.id")["mem.current"]
    jump = (pdf["mem.current"] > 1.08 * mem.shift(1)) & (pdf["mem.current"] > 1.08 * mem.shift(-1))
    assert 0 < jump[pdf["behaviour"] != "warmup"].mean() < 0.01


def test_training_loop_behaviours(loop_fleet):
    pdf = loop_fleet
    assert set(pdf["behaviour"]) == set(training_loop.BEHAVIOURS) == {"warmup", "training", "evaluation", "checkpoint"}
    assert (pdf.groupby("pod.id")["behaviour"].first() == "warmup").all()
    for pod, g in pdf.groupby("pod.id"):
        assert set(g["behaviour"]) == set(training_loop.BEHAVIOURS), pod  # every container checkpoints in 5 hours
    # the loop: warm-up -> training -> evaluation -> (checkpoint ->) training ...
    runs = _runs(pdf)
    nxt = runs.groupby("pod")["behaviour"].shift(-1)
    pairs = set(zip(runs["behaviour"], nxt.dropna().reindex(runs.index)))
    assert {(a, b) for a, b in pairs if isinstance(b, str)} == {
        ("warmup", "training"), ("training", "evaluation"), ("evaluation", "training"),
        ("evaluation", "checkpoint"), ("checkpoint", "training")}
    # levels: training works the cores hardest, checkpoints least; a warm-up holds little memory on average
    stats = pdf.groupby("behaviour")[["cpu_frac", "mem_frac"]].median()
    assert stats.loc["training", "cpu_frac"] > stats.loc["evaluation", "cpu_frac"] > stats.loc["checkpoint", "cpu_frac"]
    assert stats.loc["warmup", "cpu_frac"] < stats.loc["evaluation", "cpu_frac"]
    assert pdf.loc[pdf["behaviour"] == "warmup", "mem_frac"].mean() < 0.5 * stats.loc["training", "mem_frac"]


def test_training_loop_regular_durations(loop_fleet):
    runs = _runs(loop_fleet)
    whole = runs[~runs["last"]]
    cv = {}
    for behaviour in ("training", "evaluation"):
        lengths = whole[whole["behaviour"] == behaviour].groupby("pod")["length"]
        assert (lengths.size() >= 3).all()
        cv[behaviour] = lengths.std() / lengths.mean()
    assert cv["training"].max() < 0.2, cv["training"].max()  # +-10 % per epoch, +-1 sample
    assert cv["evaluation"].median() < 0.2  # 2-12 samples: rounding to whole samples weighs more
    # one warm-up per container, a few minutes long (6-11 samples at 30 s)
    warm = runs[runs["behaviour"] == "warmup"]
    assert len(warm) == 16 and warm["length"].between(5, 12).all()


def test_training_loop_services_are_templates(loop_fleet):
    pdf = loop_fleet
    per = pdf[pdf["behaviour"] == "training"].groupby("pod.id").agg(
        service=("service", "first"), cpu=("cpu_frac", "median"), mem=("mem_frac", "median"),
        cores=("cpu.num.cores", "first"), limit=("mem.limit", "first"))
    # the job spec: every container of a service has its template's cores and memory limit
    assert (per.groupby("service")[["cores", "limit"]].nunique() == 1).all().all()
    def rel(a: float, b: float) -> float:
        return abs(a - b) / max(a, b)

    same, other = [], []
    pods = list(per.index)
    for i, a in enumerate(pods):
        for b in pods[i + 1:]:
            d = rel(per.at[a, "cpu"], per.at[b, "cpu"]) + rel(per.at[a, "mem"], per.at[b, "mem"])
            (same if per.at[a, "service"] == per.at[b, "service"] else other).append(d)
    assert max(same) < 0.25  # +-5 % per container on each level (and the grow pattern's drift)
    assert np.median(same) < 0.3 * np.median(other)


def test_training_loop_deterministic():
    one = generate_container(5, 200, 11, 4, START, INTERVAL, profile=TL)
    pd.testing.assert_frame_equal(one, generate_container(5, 200, 11, 4, START, INTERVAL, profile=TL))
    other_seed = generate_container(5, 200, 12, 4, START, INTERVAL, profile=TL)
    assert not np.allclose(one["cpu.usage.cores"], other_seed["cpu.usage.cores"])
    default = generate_container(5, 200, 11, 4, START, INTERVAL)
    assert not np.allclose(one["cpu.usage.cores"], default["cpu.usage.cores"])
    # a container is the same whatever else is generated, and the same job at a coarser interval: same template
    short = generate_container(5, 50, 11, 4, START, INTERVAL, profile=TL)
    assert short["cpu.num.cores"].iloc[0] == one["cpu.num.cores"].iloc[0]
    assert short["mem.limit"].iloc[0] == one["mem.limit"].iloc[0]
    assert len(generate_container(5, 1, 11, 4, START, INTERVAL, profile=TL)) == 1


def test_training_loop_fleet_is_its_containers(spark):
    """generate_fleet(profile=...) gives the rows of generate_container over the ids (how the frozen
    training-loop fleet was written without Spark: bench/freeze_training_loop.py)."""
    got = _sorted(generate_fleet(spark, 6, 50, seed=11, services=3, partitions=2, profile=TL).toPandas())
    want = _sorted(pd.concat([generate_container(i, 50, 11, 3, START, INTERVAL, profile=TL) for i in range(6)]))
    pd.testing.assert_frame_equal(got, want)
