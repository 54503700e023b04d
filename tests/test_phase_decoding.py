"""Phases that follow behaviours: derived features (one definition for batch, serving and the stream), k-means
restarts, and Viterbi decoding of each container's phases."""

from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from ai4dl import stages
from ai4dl.errors import ConfigError, InputError
from ai4dl.lake.tables import Lake
from ai4dl.lake.columns import DERIVED_FEATURES
from ai4dl.method.features import BEHAVIOUR_FEATURES, derive, derive_segments
from ai4dl.method.labelling import decode_container, forward_decode, label_windows, squared_distances, switch_gap, viterbi
from ai4dl.method.windowing import segments, with_derived
from tests.configs import config_under

# ----------------------------------------------------------------------------------------------- pure


def _trace(n: int = 30, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "cpu_usage_cores": rng.uniform(0.1, 3.9, n), "cpu_num_cores": 4.0,
        "mem_current": rng.uniform(1e9, 7e9, n), "mem_limit": 8e9,
    })


def test_derived_features_by_hand():
    pdf = _trace(25)
    out = derive(pdf, DERIVED_FEATURES)
    cpu, mem = pdf["cpu_usage_cores"] / 4.0, pdf["mem_current"] / 8e9
    t = 24  # deep enough for every window to be full
    assert out["mem_frac"][t] == pytest.approx(mem[t])
    assert out["cpu_frac_min10"][t] == pytest.approx(cpu[t - 9 : t + 1].min())
    assert out["ln_cpu_frac_std20"][t] == pytest.approx(np.log(np.std(cpu[t - 19 : t + 1], ddof=1) + 0.001))
    changes = np.abs(np.diff(mem.to_numpy()))
    assert out["ln_absd_mem_frac_mean10"][t] == pytest.approx(np.log(changes[t - 10 : t].mean() + 0.001))
    assert out["ln_medd_mem_frac10"][t] == pytest.approx(np.log(np.median(changes[t - 10 : t]) + 0.001))
    assert out["mem_frac_slope10"][t] == pytest.approx((mem[t] - mem[t - 10]) / 10)
    assert out["mem_frac_range20"][t] == pytest.approx(mem[t - 19 : t + 1].max() - mem[t - 19 : t + 1].min())
    assert out["cpu_frac_median10"][t] == pytest.approx(cpu[t - 9 : t + 1].median())
    assert out["cpu_frac_max10"][t] == pytest.approx(cpu[t - 9 : t + 1].max())
    # the first step: no spread, no change yet
    assert out["ln_cpu_frac_std20"][0] == pytest.approx(np.log(0.001))
    assert out["ln_absd_cpu_frac_mean10"][0] == pytest.approx(np.log(0.001))
    # a zero limit gives no share (NaN), not an infinite one
    zero = derive(pdf.assign(mem_limit=0.0), ("mem_frac",))
    assert zero["mem_frac"].isna().all()
    with pytest.raises(InputError, match="need column"):
        derive(pdf.drop(columns="mem_limit"), ("mem_frac",))


def test_derived_features_restart_after_a_gap():
    pdf = _trace(12)
    secs = np.r_[np.arange(6) * 10.0, 1000.0 + np.arange(6) * 10.0]
    out = derive_segments(pdf, ("cpu_frac_min10",), segments(secs, max_gap_seconds=100))
    again = derive(pdf.iloc[6:].reset_index(drop=True), ("cpu_frac_min10",))
    np.testing.assert_allclose(out["cpu_frac_min10"].to_numpy()[6:], again["cpu_frac_min10"].to_numpy())


def test_viterbi_keeps_lasting_changes_and_drops_flickers():
    rng = np.random.default_rng(1)
    truth = np.repeat([0, 1, 2, 1], 25)
    centers = np.eye(3) * 3.0
    h = centers[truth] + rng.normal(0, 1.6, (len(truth), 3))
    d2 = squared_distances(centers, h)
    raw = d2.argmin(1)
    assert (raw != truth).sum() > 5  # noisy enough to flicker
    gap = switch_gap(centers, h)
    decoded = viterbi(d2, 10 * gap)
    assert (decoded != truth).sum() < (raw != truth).sum()
    assert (np.diff(decoded) != 0).sum() == 3  # the three real changes, no flicker
    np.testing.assert_array_equal(viterbi(d2, 0.0), raw)  # no price for a switch: each step's nearest phase
    assert viterbi(np.zeros((0, 3)), 1.0).size == 0


def test_forward_decoding_is_causal_and_resumable():
    """Each step's decoded phase depends on the steps up to it only (a longer trace never changes an earlier
    answer), and decoding in pieces from the carried costs and phase equals decoding in one call."""
    rng = np.random.default_rng(3)
    truth = np.repeat([0, 1, 2, 1, 0], 30)
    centers = np.eye(3) * 3.0
    d2 = squared_distances(centers, centers[truth] + rng.normal(0, 1.6, (len(truth), 3)))
    penalty = 2 * switch_gap(centers, centers[truth])
    whole = forward_decode(d2, penalty)[0]
    for t in (1, 17, 60, 149):
        np.testing.assert_array_equal(forward_decode(d2[:t], penalty)[0], whole[:t])
    acc, cur, pieces = None, None, []
    for part in np.array_split(np.arange(len(d2)), 7):
        path, acc, cur = forward_decode(d2[part], penalty, acc, cur)
        pieces.append(path)
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    raw = d2.argmin(1)
    assert (np.diff(whole) != 0).sum() < (np.diff(raw) != 0).sum()  # fewer flickers than the nearest phase
    np.testing.assert_array_equal(forward_decode(d2, 0.0)[0], raw)  # no price for a switch: the nearest phase


def test_decode_container_keeps_unlabelled_steps_and_reports_the_chosen_distance():
    centers = np.array([[0.0, 0.0], [4.0, 0.0]])
    acts = [None, [0.0, 0.1], [3.9, 0.0], [0.1, 0.0], [0.0, 0.0], [4.0, 0.0], [4.1, 0.0], [3.9, 0.0]]
    pdf = pd.DataFrame({"ts": pd.date_range("2024-01-01", periods=8, freq="10s")[::-1], "activations": acts[::-1],
                        "phase": pd.array([None, 0, 1, 0, 0, 1, 1, 1][::-1], dtype="Int32"), "distance": np.nan})
    out = decode_container(pdf, centers, "viterbi", penalty=20.0)
    assert out["phase"].isna().tolist() == [True] + [False] * 7  # sorted by ts; the step without a window stays null
    assert out["phase"].tolist()[1:] == [0, 0, 0, 0, 1, 1, 1]  # the one-step flicker at step 2 is gone
    assert out["distance"][2] == pytest.approx(3.9)  # distance to the phase it now has
    causal = decode_container(pdf, centers, "forward", penalty=20.0)  # decided at each step: the change comes late
    assert causal["phase"].tolist()[1:] == [0, 0, 0, 0, 0, 1, 1]  # one step after Viterbi places it
    assert decode_container(pdf, centers, "none", penalty=0.0)["phase"].tolist()[1:] == [0, 1, 0, 0, 1, 1, 1]


# ------------------------------------------------------------------------------------------- Spark


def test_derived_features_in_spark_equal_the_pandas_definition(spark):
    pdfs = []
    for i, pod in enumerate(("a", "b")):
        pdf = _trace(30, seed=i)
        pdf["pod_id"], pdf["ts"] = pod, pd.date_range("2024-01-01", periods=30, freq="30s")
        pdfs.append(pdf)
    df = spark.createDataFrame(pd.concat(pdfs).sample(frac=1.0, random_state=2))  # arrival order does not matter
    got = with_derived(df, BEHAVIOUR_FEATURES).toPandas().sort_values(["pod_id", "ts"]).reset_index(drop=True)
    want = pd.concat([derive(p, BEHAVIOUR_FEATURES) for p in pdfs]).reset_index(drop=True)
    for name in BEHAVIOUR_FEATURES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12)
    assert with_derived(df, ("cpu_usage_cores",)) is df  # nothing derived: the same DataFrame


@pytest.fixture(scope="module")
def decoded(spark, test_config, tmp_path_factory, dlaas_sample):
    """The DLaaS sample through window -> train -> label with the behaviour features, k-means restarts and
    Viterbi decoding (and the same model's undecoded labels)."""
    root = tmp_path_factory.mktemp("decoded")
    cfg = config_under(
        test_config, root,
        window={"features": BEHAVIOUR_FEATURES, "train_fraction": 1.0},
        train={"epochs": 5, "k": 3, "n_hidden": 8, "kmeans_restarts": 2, "batch_size": 32},
        label={"smoothing": "viterbi", "switch_penalty": 10.0},
    )
    stages.ingest(cfg, spark, input=str(dlaas_sample))
    stages.window(cfg, spark)
    trained = stages.train(cfg, spark)
    stages.label(cfg, spark)
    lake = Lake.for_config(spark, cfg)
    model = trained.details["model"]
    raw = label_windows(lake.read("silver"), model).toPandas()
    return SimpleNamespace(cfg=cfg, lake=lake, model=model, raw=raw, phases=lake.read("phases").toPandas())


def test_decoded_phases_switch_less_and_stay_the_models_phases(decoded):
    assert decoded.model.info["switch_gap"] > 0 and decoded.model.features == BEHAVIOUR_FEATURES

    def switches(df):
        df = df[df["phase"].notna()].sort_values(["pod_id", "ts"])
        return int((df.groupby("pod_id")["phase"].diff().fillna(0) != 0).sum())

    assert switches(decoded.phases) <= switches(decoded.raw)
    assert set(decoded.phases["phase"].dropna().astype(int)) <= set(range(3))
    assert decoded.phases["phase"].notna().sum() == decoded.raw["phase"].notna().sum()


def test_serving_and_the_stream_compute_the_same_derived_windows(decoded, dlaas_sample):
    """The pyfunc path (label_traces) and the stream's step (advance) label the raw traces as the batch
    labels silver, derived features included (undecoded: they label step by step)."""
    from ai4dl.method.serving import label_traces
    from ai4dl.policies.live import Deployment
    from ai4dl.stream.online import Live, advance

    sample = pd.read_csv(dlaas_sample)
    served = label_traces(decoded.model, sample)
    raw = decoded.raw.assign(ts_s=decoded.raw["ts"].astype("int64") // 10**9)
    merged = served.merge(raw[["pod_id", "ts_s", "phase"]], left_on=["pod_id", "ts"], right_on=["pod_id", "ts_s"],
                          suffixes=("_served", "_batch"))
    assert len(merged) == len(sample)
    pd.testing.assert_series_equal(merged["phase_served"].astype("Int64"), merged["phase_batch"].astype("Int64"),
                                   check_names=False)

    live = Live(model=decoded.model, model_id=decoded.model.model_id, n_history=decoded.cfg.window.n_history,
                deployment=Deployment.limits())
    pod = sample[sample["pod.id"] == "exec1"].rename(columns=lambda c: c.replace(".", "_")).rename(columns={"timestamp": "ts"})
    pod["ts"] = pd.to_datetime(pod["ts"], unit="s")
    pod["behaviour"], pod["source_file"], pod["ingested_at"] = None, "f", pod["ts"]
    state, streamed = None, []
    for rows in np.array_split(np.arange(len(pod)), 4):  # micro-batches of the same container
        out, state = advance("exec1", pod.iloc[rows], state, live)
        streamed.append(out[out["kind"] == "phase"])
    got = pd.concat(streamed)["phase"].astype("Int64").tolist()
    want = raw[raw["pod_id"] == "exec1"].sort_values("ts")["phase"].astype("Int64").tolist()
    assert got == want


def test_forward_decoding_is_the_same_in_batch_serving_and_the_stream(decoded, dlaas_sample):
    """The default decoding is causal, so every path gives the same phases at every step: the label stage's
    (decoded in Spark per container), the served model's, and the stream's over uneven micro-batches whose
    state goes through the state store's tuple between every two of them (what a restart reads back)."""
    from ai4dl.method.labelling import switch_cost
    from ai4dl.method.serving import label_traces
    from ai4dl.policies.live import Deployment
    from ai4dl.stream.online import Live, advance, state_from_tuple, state_to_tuple

    model = decoded.model
    batch = label_windows(decoded.lake.read("silver"), model, decoding="forward").toPandas()
    batch = batch.assign(ts_s=batch["ts"].astype("int64") // 10**9).sort_values(["pod_id", "ts"]).reset_index(drop=True)
    assert (batch["phase"] != decoded.raw.sort_values(["pod_id", "ts"])["phase"].to_numpy()).any()  # it decodes
    sample = pd.read_csv(dlaas_sample)
    served = label_traces(model, sample, decoding="forward").sort_values(["pod_id", "ts"]).reset_index(drop=True)
    assert served["phase"].astype("Int64").tolist() == batch["phase"].astype("Int64").tolist()
    np.testing.assert_allclose(served["distance"], batch["distance"].astype(float), rtol=1e-9)

    live = Live(model=model, model_id=model.model_id, n_history=decoded.cfg.window.n_history,
                deployment=Deployment.limits(), decoding="forward", switch_penalty=switch_cost(model, "forward"))
    frame = sample.rename(columns=lambda c: c.replace(".", "_")).rename(columns={"timestamp": "ts"})
    frame["ts"] = pd.to_datetime(frame["ts"], unit="s")
    frame["behaviour"], frame["source_file"], frame["ingested_at"] = None, "f", frame["ts"]
    for pod, rows in frame.groupby("pod_id"):
        rows = rows.sort_values("ts")
        state, streamed = None, []
        cuts = sorted({c for c in (1, 5, 6, 20, 41, len(rows) // 2) if c < len(rows)})  # uneven, none empty
        for part in np.split(np.arange(len(rows)), cuts):
            out, state = advance(pod, rows.iloc[part], state, live)
            state = state_from_tuple(state_to_tuple(state))
            mine = out[out["kind"] == "phase"]
            streamed += zip(mine["phase"].tolist(), mine["distance"].astype(float).tolist())
        want = batch[batch["pod_id"] == pod]
        assert [None if pd.isna(p) else int(p) for p, _ in streamed] == [None if pd.isna(p) else int(p) for p in want["phase"]], pod
        np.testing.assert_allclose([d for _, d in streamed], want["distance"].astype(float), rtol=1e-9)


def test_decoding_refuses_a_model_without_its_gap(decoded):
    from ai4dl.method.labelling import decode

    assert decoded.model.classifier is not None  # a trained model's costs come from its phase classifier
    # trained before decoding existed: neither a switch gap nor a classifier
    bare = dataclasses.replace(decoded.model, classifier=None).with_info(switch_gap=None)
    with pytest.raises(ConfigError, match="switch_gap"):
        decode(decoded.lake.read("phases"), bare, "viterbi", 10.0)
    assert decoded.lake.read("phases").where(F.col("phase").isNull()).count() == 3 * 4  # n_history steps per container


def test_a_zero_limit_leaves_steps_unlabelled_instead_of_misread(decoded, dlaas_sample):
    """A share of a zero limit is not a number: those windows get no phase (serving and the stream, as silver)
    rather than features that read as a perfectly steady container."""
    from ai4dl.method.serving import label_traces
    from ai4dl.policies.live import Deployment
    from ai4dl.stream.online import Live, advance

    sample = pd.read_csv(dlaas_sample)
    sample.loc[sample["pod.id"] == "exec1", "cpu.num.cores"] = 0.0
    served = label_traces(decoded.model, sample)
    assert served[served["pod_id"] == "exec1"]["phase"].isna().all()
    assert served[served["pod_id"] != "exec1"]["phase"].notna().sum() > 0
    live = Live(model=decoded.model, model_id=decoded.model.model_id, n_history=decoded.cfg.window.n_history,
                deployment=Deployment.limits())
    pod = sample[sample["pod.id"] == "exec1"].rename(columns=lambda c: c.replace(".", "_")).rename(columns={"timestamp": "ts"})
    pod["ts"] = pd.to_datetime(pod["ts"], unit="s")
    pod["behaviour"], pod["source_file"], pod["ingested_at"] = None, "f", pod["ts"]
    out, _ = advance("exec1", pod, None, live)
    assert out[out["kind"] == "phase"]["phase"].isna().all()
