"""Allocation policies: hand-computed allocations, invariants, the fleet replay and its summary."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ai4dl.lake.schema import POLICY_REPLAY
from ai4dl.policies.fleet import replay_fleet, summarise
from ai4dl.policies.replay import (
    POLICIES,
    PolicyParams,
    allocate,
    format_summary,
    phase_stats_for_policy,
    replay_container,
)

USAGE8 = np.arange(1.0, 9.0)  # [1, 2, ..., 8]
P4 = PolicyParams(interval_steps=4, k_std=1.0, margin=0.0, vpa_percentile=0.4, vpa_half_life_steps=1)
R1 = 2.5 + np.sqrt(1.25)  # mean + 1 * population std of [1, 2, 3, 4]
R2 = 6.5 + np.sqrt(1.25)  # ... of [5, 6, 7, 8]


# ------------------------------------------------------------------------------------- hand-made traces


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("static", [10, 10, 10, 10, 10, 10, 10, 10]),
        ("current.step.max", [4, 4, 4, 4, 8, 8, 8, 8]),
        ("current.step.rules", [R1, R1, R1, R1, R2, R2, R2, R2]),
        ("prev.step.max", [10, 10, 10, 10, 4, 4, 4, 4]),
        ("prev.step.rules", [10, 10, 10, 10, R1, R1, R1, R1]),
        # weights relative to the newest sample 1/8, 1/4, 1/2, 1 (total 15/8); 0.4 * 15/8 = 0.75 is reached at 3
        ("vpa", [10, 10, 10, 10, 3, 3, 3, 3]),
        ("phase.rule", [10, 10, 10, 10, 10, 10, 10, 10]),  # no phases given: the limit
    ],
)
def test_hand_computed_allocations(policy, expected):
    got = allocate(policy, USAGE8, 10.0, P4)
    np.testing.assert_allclose(got, np.asarray(expected, dtype=float), rtol=1e-12)


def test_rules_values_literal():
    got = allocate("current.step.rules", USAGE8, 10.0, P4)
    np.testing.assert_allclose(got[[0, 4]], [3.6180339887498949, 7.6180339887498949], rtol=1e-12)


def test_vpa_hand_computed_three_intervals_and_margin():
    usage = np.arange(1.0, 13.0)
    # interval 2 (t0 = 8): samples 1..8, weights 2**-(7-s); cumulative weight first reaches 0.4 * total at 7
    np.testing.assert_allclose(allocate("vpa", usage, 10.0, P4), [10] * 4 + [3] * 4 + [7] * 4)
    with_margin = PolicyParams(interval_steps=4, margin=0.15, vpa_percentile=0.4, vpa_half_life_steps=1)
    np.testing.assert_allclose(allocate("vpa", usage, 10.0, with_margin), [10] * 4 + [3.45] * 4 + [8.05] * 4)


def test_vpa_equal_weights_is_plain_lower_quantile():
    p = PolicyParams(interval_steps=4, margin=0.0, vpa_percentile=0.5, vpa_half_life_steps=1e12)
    np.testing.assert_allclose(allocate("vpa", USAGE8, 10.0, p), [10, 10, 10, 10, 2, 2, 2, 2])


def test_phase_rule_uses_last_phase_before_interval():
    usage = np.ones(16)
    phases = np.array([None, None, 0, 0, 0, 1, 1, None, 2, 2, 2, 2, 3, 3, 3, 3], dtype=object)
    stats = {0: {"cpu": 2.0, "mem": 20.0}, 1: {"cpu": 4.0, "mem": 40.0}, 3: {"cpu": 99.0, "mem": 1.0}}
    p = PolicyParams(interval_steps=4, margin=0.1)
    # interval 0: nothing seen -> limit; 1: step 3's phase 0; 2: step 7 is unlabelled, step 6's phase 1;
    # 3: phase 2 has no statistics -> limit
    np.testing.assert_allclose(
        allocate("phase.rule", usage, 10.0, p, phases, stats, "cpu"), [10] * 4 + [2.2] * 4 + [4.4] * 4 + [10] * 4
    )
    np.testing.assert_allclose(
        allocate("phase.rule", usage, 100.0, p, phases, stats, "mem"), [100] * 4 + [22] * 4 + [44] * 4 + [100] * 4
    )
    # phase 3 (seen before a fifth interval) asks for 99 * 1.1 cores: capped at the limit
    usage20 = np.ones(20)
    phases20 = np.concatenate([phases, np.array([3, 3, 3, 3], dtype=object)])
    got = allocate("phase.rule", usage20, 10.0, p, phases20, stats, "cpu")
    np.testing.assert_allclose(got[16:], [10] * 4)


def test_phase_rule_accepts_float_phases_and_string_keys():
    usage = np.ones(8)
    phases = np.array([np.nan, 1.0, 1.0, 1.0, np.nan, np.nan, np.nan, np.nan])
    got = allocate("phase.rule", usage, 10.0, PolicyParams(interval_steps=4, margin=0.0), phases, {"1": {"cpu": 3}})
    np.testing.assert_allclose(got, [10] * 4 + [3] * 4)


def test_allocations_capped_at_limit_and_non_negative():
    usage = np.array([5.0, 20.0, 5.0, 20.0, 0.0, 0.0, 0.0, 0.0, 30.0, 1.0])
    p = PolicyParams(interval_steps=4, k_std=3.0, margin=0.5, vpa_percentile=1.0, vpa_half_life_steps=5)
    stats = {0: {"cpu": 1e9}}
    phases = np.zeros(len(usage))
    for policy in POLICIES:
        got = allocate(policy, usage, 10.0, p, phases, stats)
        assert got.shape == usage.shape
        assert np.all(got <= 10.0) and np.all(got >= 0.0), policy
    # usage above the limit is not met even by the oracle
    assert allocate("current.step.max", usage, 10.0, p)[1] == 10.0
    # negative (broken) samples never give a negative allocation
    assert np.all(allocate("current.step.max", -usage, 10.0, p) >= 0.0)


def test_per_step_limit_and_null_usage():
    usage = np.array([1.0, np.nan, 3.0, 2.0, np.nan, np.nan, np.nan, np.nan, 1.0])
    limit = np.array([5.0] * 4 + [6.0] * 5)
    p = PolicyParams(interval_steps=4, k_std=0.0)
    np.testing.assert_allclose(allocate("static", usage, limit, p), limit)
    np.testing.assert_allclose(allocate("current.step.max", usage, limit, p), [3, 3, 3, 3, 6, 6, 6, 6, 1])
    # interval 2 reacts to interval 1, which has no usage: the limit
    np.testing.assert_allclose(allocate("prev.step.max", usage, limit, p), [5, 5, 5, 5, 3, 3, 3, 3, 6])
    np.testing.assert_allclose(allocate("prev.step.rules", usage, limit, p), [5] * 4 + [2] * 4 + [6])


def test_unknown_policy_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        allocate("best.guess", USAGE8, 10.0, P4)


def test_params_from_config():
    from ai4dl.config import Config

    assert PolicyParams.from_config(Config().policies) == PolicyParams()
    assert PolicyParams.from_config({"interval_steps": 3}).interval_steps == 3
    with pytest.raises(ValueError):
        PolicyParams(interval_steps=0)


# ------------------------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=200),
    limit=st.floats(0.5, 64.0),
    interval=st.integers(1, 25),
)
def test_oracle_max_never_under_provisions(data, limit, interval):
    usage = np.asarray(data) * limit  # within the limit
    alloc = allocate("current.step.max", usage, limit, PolicyParams(interval_steps=interval))
    assert np.all(alloc >= usage)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(st.one_of(st.floats(0.0, 100.0), st.just(float("nan"))), min_size=1, max_size=120),
    interval=st.integers(1, 12),
    k=st.floats(0.0, 4.0),
    margin=st.floats(0.0, 1.0),
    q=st.floats(0.0, 1.0),
)
def test_every_policy_within_zero_and_limit(data, interval, k, margin, q):
    usage = np.asarray(data, dtype=float)
    p = PolicyParams(interval_steps=interval, k_std=k, margin=margin, vpa_percentile=q, vpa_half_life_steps=7)
    phases = np.arange(len(usage)) % 3
    stats = {0: {"cpu": 5.0}, 1: {"cpu": 500.0}}
    for policy in POLICIES:
        alloc = allocate(policy, usage, 50.0, p, phases, stats)
        assert alloc.shape == usage.shape
        assert np.all((alloc >= 0.0) & (alloc <= 50.0)), policy


def test_vpa_on_stationary_trace_approaches_percentile_and_is_fast():
    rng = np.random.default_rng(0)
    usage = rng.uniform(0.0, 1.0, 2000)
    p = PolicyParams(interval_steps=10, margin=0.0, vpa_percentile=0.9, vpa_half_life_steps=120)
    t = time.perf_counter()
    alloc = allocate("vpa", usage, 2.0, p)
    assert time.perf_counter() - t < 2.0
    np.testing.assert_allclose(alloc[:10], 2.0)  # no history: the limit
    late = alloc[1000:]
    assert abs(late.mean() - 0.9) < 0.02
    assert np.all(np.abs(late - 0.9) < 0.08)


# ------------------------------------------------------------------------------------- replay_container


def _container(pod, service, cpu, cpu_limit, mem, mem_limit, phases=None):
    n = len(cpu)
    start = datetime(2024, 1, 1)
    return pd.DataFrame(
        {
            "pod_id": pod,
            "service": service,
            "ts": [start + timedelta(seconds=30 * i) for i in range(n)],
            "step": np.arange(n, dtype="int32"),
            "phase": phases if phases is not None else [None] * n,
            "distance": [None] * n,
            "activations": [None] * n,
            "cpu_usage_cores": cpu,
            "cpu_num_cores": [cpu_limit] * n,
            "mem_current": mem,
            "mem_limit": [mem_limit] * n,
            "behaviour": [None] * n,
            "model_id": "m1",
        }
    )


def test_replay_container_rows_and_metrics():
    pdf = _container("a", "svc", list(USAGE8), 10.0, [100.0] * 8, 200.0)
    out = replay_container(pdf.sample(frac=1.0, random_state=1), P4, None)  # unsorted input
    assert list(out.columns) == [f.name for f in POLICY_REPLAY.fields]
    assert len(out) == 2 * len(POLICIES)
    row = out[(out.policy == "prev.step.rules") & (out.resource == "cpu")].iloc[0]
    assert row.steps == 8 and row.used == 36.0 and row.static_allocated == 80.0
    assert row.allocated == pytest.approx(40.0 + 4 * R1)
    assert row.met_steps == 4 and row.shortfall_steps == 4
    assert row.shortfall_total == pytest.approx(26.0 - 4 * R1)
    assert row.shortfall_max == pytest.approx(8.0 - R1)
    mem = out[(out.policy == "current.step.max") & (out.resource == "mem")].iloc[0]
    assert mem.allocated == 800.0 and mem.met_steps == 8 and mem.shortfall_total == 0.0


def test_replay_container_skips_null_usage():
    cpu = [1.0, None, 3.0, 4.0, 5.0, 6.0]
    pdf = _container("a", "svc", cpu, 10.0, [1.0] * 6, 2.0)
    out = replay_container(pdf, P4, None)
    static = out[(out.policy == "static") & (out.resource == "cpu")].iloc[0]
    assert static.steps == 5 and static.used == 19.0 and static.static_allocated == 50.0
    assert out[out.resource == "mem"].steps.eq(6).all()


# ------------------------------------------------------------------------------------------- fleet level


def _fleet_pdf():
    a = _container("a", "svc1", list(USAGE8), 10.0, [100.0] * 8, 200.0, [None, 0, 0, 1, 1, 1, 0, 0])
    b = _container("b", "svc2", [2.0] * 4, 4.0, [50.0] * 4, 100.0, [None, 1, 1, 1])
    return a, b


def _spark_df(spark, pdfs):
    from ai4dl.lake.schema import PHASES

    rows = []
    for pdf in pdfs:
        for r in pdf.itertuples(index=False):
            rows.append(
                (
                    r.pod_id,
                    r.service,
                    pd.Timestamp(r.ts).to_pydatetime(),
                    int(r.step),
                    None if r.phase is None or pd.isna(r.phase) else int(r.phase),
                    None,
                    None,
                    None if pd.isna(r.cpu_usage_cores) else float(r.cpu_usage_cores),
                    float(r.cpu_num_cores),
                    float(r.mem_current),
                    float(r.mem_limit),
                    None,
                    r.model_id,
                )
            )
    return spark.createDataFrame(rows, PHASES)


def test_summarise_arithmetic(spark):
    a, b = _fleet_pdf()
    pdf = pd.concat([replay_container(a, P4, None), replay_container(b, P4, None)], ignore_index=True)
    replay = spark.createDataFrame(pdf, POLICY_REPLAY)
    s = summarise(replay).toPandas()
    assert list(s.resource.unique()) == ["cpu", "mem"]
    assert list(s[s.resource == "cpu"].policy) == list(POLICIES)
    cpu = s[s.resource == "cpu"].set_index("policy")
    prev_rules = 40.0 + 4 * R1 + 16.0  # a: limit, then mean+std of [1..4]; b: one interval at the limit
    assert (cpu.containers == 2).all()
    assert cpu.loc["static", "allocated"] == 96.0 and cpu.loc["static", "savings_vs_static"] == 0.0
    assert cpu.loc["static", "fulfilment"] == 1.0
    assert cpu.loc["static", "utilisation"] == pytest.approx(44.0 / 96.0)
    assert cpu.loc["current.step.max", "allocated"] == 56.0  # a: 4*4 + 8*4, b: 2*4
    assert cpu.loc["current.step.max", "savings_vs_static"] == pytest.approx(1 - 56.0 / 96.0)
    assert cpu.loc["current.step.max", "savings_vs_prev_rules"] == pytest.approx(1 - 56.0 / prev_rules)
    assert cpu.loc["current.step.max", "fulfilment"] == 1.0
    assert cpu.loc["prev.step.rules", "allocated"] == pytest.approx(prev_rules)
    assert cpu.loc["prev.step.rules", "savings_vs_prev_rules"] == 0.0
    assert cpu.loc["prev.step.rules", "fulfilment"] == pytest.approx(8.0 / 12.0)
    assert cpu.loc["prev.step.max", "allocated"] == 72.0
    assert cpu.loc["prev.step.max", "shortfall_steps"] == 4
    assert cpu.loc["prev.step.max", "shortfall_total"] == 10.0  # (5-4) + (6-4) + (7-4) + (8-4)
    assert cpu.loc["prev.step.max", "shortfall_max"] == 4.0
    mem = s[s.resource == "mem"].set_index("policy")
    assert mem.loc["prev.step.rules", "savings_vs_prev_rules"] == 0.0
    assert mem.loc["current.step.max", "savings_vs_static"] == pytest.approx(1 - 1000.0 / 2000.0)
    text = format_summary(s)
    assert "savings_vs_static" in text and "prev.step.rules" in text and "50.0%" in text
    assert len({len(line) for line in text.splitlines()}) == 1  # fixed width


def test_replay_fleet_equals_pandas_replay(spark):
    a, b = _fleet_pdf()
    c = _container("c", "svc1", [0.5, None, 2.5, 1.0, 3.0, 0.2, 0.1], 3.0, [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0], 10.0,
                   [None, None, 2, 2, 0, None, 1])
    stats = {0: {"cpu": 3.0, "mem": 150.0}, 1: {"cpu": 1.5, "mem": 60.0}, 2: {"cpu": 2.0, "mem": 8.0}}
    params = PolicyParams(interval_steps=3, k_std=1.5, margin=0.1, vpa_percentile=0.8, vpa_half_life_steps=4)
    got = replay_fleet(_spark_df(spark, [a, b, c]), params, stats).toPandas()
    want = pd.concat([replay_container(pdf, params, stats) for pdf in (a, b, c)])
    key = ["pod_id", "resource", "policy"]
    got = got.sort_values(key).reset_index(drop=True)
    want = want.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12)
    assert len(got) == 3 * 2 * len(POLICIES)


def test_phase_stats_for_policy():
    pdf = pd.DataFrame(
        {
            "phase": [0, 1, 0, None],
            "service": ["__all__", "__all__", "svc1", "__all__"],
            "cpu_p95": [1.5, 2.5, 9.0, 7.0],
            "mem_p95": [100.0, None, 9.0, 7.0],
            "cpu_p99": [1.9, 2.9, 9.0, 7.0],
            "mem_p99": [110.0, 210.0, 9.0, 7.0],
        }
    )
    got = phase_stats_for_policy(pdf)
    assert got.keys() == {0, 1}
    assert got[0] == {"cpu": 1.5, "mem": 100.0}
    assert got[1]["cpu"] == 2.5 and np.isnan(got[1]["mem"])
    assert phase_stats_for_policy(pdf, ("cpu_p99", "mem_p99"))[1] == {"cpu": 2.9, "mem": 210.0}
    # a NaN statistic falls back to the limit in phase.rule
    alloc = allocate("phase.rule", np.ones(4), 500.0, PolicyParams(interval_steps=2), [1, 1, 1, 1], got, "mem")
    np.testing.assert_allclose(alloc, [500.0] * 4)
    with pytest.raises(ValueError, match="lack"):
        phase_stats_for_policy(pdf, ("cpu_p50", "mem_p50"))


def test_phase_rule_with_fractions_of_the_limit(spark):
    # phase 1 uses 20% of the limit, phase 2 40%; the rule allocates that share of each container's own limit
    stats = {1: {"cpu_fraction": 0.2, "mem_fraction": 0.5}, 2: {"cpu_fraction": 0.4, "mem_fraction": 0.5}}
    usage = np.array([1.0, 1, 1, 1, 1, 1, 1, 1])
    phases = [1, 1, 1, 1, 2, 2, 2, 2]
    p = PolicyParams(interval_steps=4, margin=0.0)
    np.testing.assert_allclose(allocate("phase.rule", usage, 10.0, p, phases, stats, "cpu"), [10] * 4 + [2.0] * 4)
    np.testing.assert_allclose(allocate("phase.rule", usage, 40.0, p, phases, stats, "cpu"), [40] * 4 + [8.0] * 4)

    from ai4dl.policies.fleet import phase_fraction_stats
    from ai4dl.lake.schema import PHASES

    t0 = datetime(2024, 1, 1)
    rows = [
        ("a", "s", t0, i, ph, None, None, cpu, 4.0, mem, 100.0, None, "m")
        for i, (ph, cpu, mem) in enumerate([(0, 1.0, 10.0), (0, 2.0, 20.0), (1, 4.0, 100.0)])
    ]
    got = phase_fraction_stats(spark.createDataFrame(rows, PHASES), quantile=1.0)
    assert got == {0: {"cpu_fraction": 0.5, "mem_fraction": 0.2}, 1: {"cpu_fraction": 1.0, "mem_fraction": 1.0}}
