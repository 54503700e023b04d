"""The VPA recommender port gives the real recommender's numbers, byte for byte, on every conformance vector."""

from __future__ import annotations

import numpy as np
import pytest

from ai4dl.errors import InputError
from ai4dl.policies.vpa import VpaParams, VpaRecommender, cpu_targets, params_from_flags, recommend_csv, recommend_trace

MATCHED = ["-step-seconds", "10", "-cpu-half-life", "1200s", "-mem-half-life", "1200s", "-mem-interval", "1200s"]
# Vector file -> (its input, the harness flags that produced it), as listed in ../shared/data/vpa/README.md.
VECTORS = {
    "dlaas.vpa.defaults.rec.csv": ("dlaas", []),
    "dlaas.vpa.matched.rec.csv": ("dlaas", MATCHED),
    "fleet.vpa.defaults.rec.csv": ("fleet", []),
    "fleet.vpa.matched.rec.csv": ("fleet", MATCHED),
    "fleet.vpa.matched.peak1.nomin.rec.csv": ("fleet", [*MATCHED, "-mem-interval", "10s", "-min-cpu-millicores", "0", "-min-mem-mb", "0"]),
    "fleet.vpa.matched.oom.rec.csv": ("fleet", [*MATCHED, "-oom-on-shortfall"]),
}


@pytest.fixture(scope="session")
def vpa_vectors(project_root):
    d = project_root.parent / "shared" / "data" / "vpa"
    if not d.is_dir():
        pytest.skip(f"VPA conformance vectors not present: {d}")
    return d


def test_every_vector_file_is_listed(vpa_vectors):
    assert {p.name for p in vpa_vectors.glob("*.rec.csv")} == set(VECTORS)


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_recommendations_equal_the_real_vpa(vpa_vectors, tmp_path, name):
    source, flags = VECTORS[name]
    out = tmp_path / name
    recommend_csv(vpa_vectors / f"{source}.generic.csv", out, interval=10, params=params_from_flags(flags))
    assert out.read_text() == (vpa_vectors / name).read_text()


def test_cli_writes_the_same_file(vpa_vectors, tmp_path):
    from ai4dl.cli import main

    out = tmp_path / "rec.csv"
    assert main(["vpa-recommend", str(vpa_vectors / "dlaas.generic.csv"), "--interval", "10", *MATCHED, "--out", str(out)]) == 0
    assert out.read_text() == (vpa_vectors / "dlaas.vpa.matched.rec.csv").read_text()


def test_cli_refuses_bad_flags_and_input_in_one_line(tmp_path, capsys):
    from ai4dl.cli import main

    bad = tmp_path / "in.csv"
    bad.write_text("pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used\np,abc,0.1,1e8\n")
    assert main(["vpa-recommend", str(bad), "--out", str(tmp_path / "o.csv"), "-cpu-half-life", "soon"]) == 2
    assert main(["vpa-recommend", str(bad), "--out", str(tmp_path / "o.csv")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "cpu-half-life" in errors[0] and "in.csv" in errors[1]


def test_bucket_upper_edge_margin_and_minimum():
    p = VpaParams(step_seconds=10, cpu_half_life_s=1200, memory_half_life_s=1200, memory_aggregation_interval_s=1200)
    out = recommend_trace(np.arange(30) * 10.0, np.full(30, 0.5), np.full(30, 3e8), interval=10, params=p)
    assert np.isnan(out["cpu_target"].iloc[0])  # no history, no recommendation
    assert out["cpu_target"].iloc[1] == 0.587  # bucket upper edge 0.511 core, + int(511 * 0.15) millicores
    r = VpaRecommender()
    for k in range(10):
        r.add_sample(1_700_000_000 + 10.0 * k, 0.0101, 1e6)
    rec = r.recommend()
    assert (rec.cpu_target, rec.mem_target) == (0.025, 262144000.0)  # the pod minimum, not minimum + margin


def test_samples_fed_in_vpa_units_give_the_same_targets():
    """A replay converts each sample to VPA's clock and units once and feeds runs of memory samples in one call
    (most change nothing but the last sample time): the same recommendations as feeding them one by one."""
    rng = np.random.default_rng(3)
    t = 1_700_000_000 + np.cumsum(rng.integers(5, 40, 400)).astype(float)
    mem = np.abs(np.cumsum(rng.normal(1e6, 2e7, 400))) + 3e8
    cpu = rng.gamma(2.0, 0.3, 400)
    one, runs = VpaRecommender(), VpaRecommender()
    at = [VpaRecommender.time_ns(x) for x in t]
    amounts = [VpaRecommender.memory_amount(m) for m in mem]
    for start in range(0, 400, 25):
        for k in range(start, start + 25):
            one.add_sample(t[k], cpu[k], mem[k])
            runs.add_cpu_at(at[k], VpaRecommender.cpu_amount(cpu[k]))
        if start == 200:  # an OOM kill in between
            one.record_oom(t[start + 24], 2e8)
        runs.add_memory_run(at, amounts, start, start + 25)
        if start == 200:
            runs.record_oom_at(at[start + 24], 2e8)
        assert one.recommend() == runs.recommend()
        assert (one.target("mem", 0.5), one.target("cpu", 0.7)) == (runs.target("mem", 0.5), runs.target("cpu", 0.7))


@pytest.mark.parametrize("case", ["steps", "irregular", "backwards", "past-100-half-lives", "one-bucket", "clock-start", "many-ends"])
def test_cpu_targets_at_once_equal_a_recommender_fed_sample_by_sample(case):
    """cpu_targets answers every end and percentile from running sums over the samples: the same doubles as a
    recommender fed one sample at a time and asked at each end (out-of-order samples dropped, a trace in one bucket,
    times near the clock's start (no re-base), ends before any sample, an end twice, an end past the samples, more
    ends than one block holds). A trace past 100 half-lives re-bases: cpu_targets feeds a recommender then."""
    rng = np.random.default_rng(len(case))
    n = 600
    params = VpaParams(cpu_half_life_s=1200)
    if case in ("steps", "many-ends"):
        at = [VpaRecommender.time_ns(step=k, step_seconds=10.0) for k in range(n)]
    elif case == "clock-start":  # within 100 half-lives of Go's zero time: the histogram keeps reference 0
        at = [10**9 * (1 + 10 * k) for k in range(n)]
    else:
        gaps = rng.integers(1, 90, n).astype(float)
        if case == "past-100-half-lives":
            gaps[n // 2] = 1200 * 150
        t = 1_700_000_000 + np.cumsum(gaps) + rng.random(n)
        if case == "backwards":
            t[rng.random(n) < 0.1] -= 200
        at = [VpaRecommender.time_ns(x) for x in t]
    cpu = np.full(n, 0.5) if case == "one-bucket" else rng.gamma(2.0, 1.5, n) * (1 + np.arange(n) / n)
    amounts = [VpaRecommender.cpu_amount(c) for c in cpu]
    percentiles = [0.0, 0.5, 0.9, 0.95, 0.99, 1.0]
    ends = [0, 0, 1, 2, 7, 7, 50, 299, 300, 301, 599, 600, 650]
    if case == "many-ends":
        ends = sorted(rng.integers(0, n + 1, 9000).tolist())
    got = cpu_targets(at, amounts, ends, percentiles, params)
    want = np.full_like(got, np.nan)
    rec, j = VpaRecommender(params), 0
    for e, end in enumerate(ends):
        for j in range(j, min(end, n)):
            rec.add_cpu_at(at[j], amounts[j])
        j = min(end, n)
        for i, q in enumerate(percentiles):
            target = rec.target("cpu", q)
            want[i, e] = np.nan if target is None else target
    np.testing.assert_array_equal(got, want)
    first = int(np.searchsorted(ends, 1))
    assert np.isnan(got[:, :first]).all() and not np.isnan(got[:, first:]).any()


def test_bad_params_are_input_errors():
    with pytest.raises(InputError, match="unknown VPA flag"):
        params_from_flags(["-nope", "1"])
    with pytest.raises(InputError):
        recommend_trace(np.arange(3.0), np.ones(3), np.ones(3), interval=0)
