"""Phase runs (pure and in Spark), transitions, graphs, prototypes (ai4dl.behaviour) and gold phase statistics."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta

import networkx as nx
import numpy as np
import pytest

from ai4dl.behaviour import graph as G
from ai4dl.behaviour import runs as R
from ai4dl.behaviour import sequences as B
from ai4dl.reporting import plots
from ai4dl.behaviour.phase_stats import ALL_SERVICES, PHASE_STATS, create_bi_views, phase_statistics
from ai4dl.lake.tables import delta_table
from ai4dl.lake.schema import PHASE_SEQUENCES, PHASES

T0 = datetime(2024, 1, 1, 0, 0, 0)
DT = 30  # seconds between samples


def phase_rows(pod, service, phases, cpu=None, mem=None):
    """PHASES rows for one container: step i at T0 + i * DT."""
    rows = []
    for i, p in enumerate(phases):
        c = None if cpu is None else float(cpu[i])
        m = None if mem is None else float(mem[i])
        rows.append(
            (pod, service, T0 + timedelta(seconds=DT * i), i, p, None, None, c, 4.0, m, 1e9, None, "m1")
        )
    return rows


def make_phases(spark, containers):
    rows = []
    for args in containers:
        rows += phase_rows(*args)
    rows.reverse()  # order must come from `step`, not from the input order
    return spark.createDataFrame(rows, PHASES)


def runs_of(df):
    return sorted(tuple(r) for r in df.collect())


# ------------------------------------------------------------------------------------------------ pure helpers


@pytest.mark.parametrize(
    "seq, expected",
    [
        ([], []),
        ([3], [(3, 0, 1)]),
        ([2, 2, 2, 2], [(2, 0, 4)]),
        ([0, 0, 1, 1, 2], [(0, 0, 2), (1, 2, 2), (2, 4, 1)]),
        ([0, 1, 0], [(0, 0, 1), (1, 1, 1), (0, 2, 1)]),
        ([None, 0, None, 0, 1], [(0, 1, 2), (1, 4, 1)]),  # nulls skipped, do not split
        ([None, None], []),
    ],
)
def test_rle(seq, expected):
    assert R.rle(seq) == expected


@pytest.mark.parametrize(
    "runs, min_len, expected",
    [
        ([], 3, []),
        ([(1, 0, 1)], 3, [(1, 0, 1)]),  # nothing long to absorb into: unchanged
        ([(1, 0, 5)], 3, [(1, 0, 5)]),
        ([(0, 0, 2), (1, 2, 2)], 1, [(0, 0, 2), (1, 2, 2)]),  # min_len 1: no-op
        ([(2, 0, 1), (0, 1, 4), (1, 5, 3)], 2, [(0, 0, 5), (1, 5, 3)]),  # short at start -> next
        ([(0, 0, 4), (1, 4, 1), (2, 5, 4)], 2, [(0, 0, 5), (2, 5, 4)]),  # short in middle -> previous
        ([(0, 0, 4), (1, 4, 1), (0, 5, 4)], 2, [(0, 0, 9)]),  # ... then equal neighbours re-merge
        ([(0, 0, 4), (1, 4, 3), (2, 7, 1)], 2, [(0, 0, 4), (1, 4, 4)]),  # short at end -> previous
        ([(3, 0, 1), (4, 1, 1), (0, 2, 4), (1, 6, 1), (5, 7, 1)], 2, [(0, 0, 8)]),  # several short
        ([(0, 0, 1), (1, 1, 1), (0, 2, 1)], 5, [(0, 0, 1), (1, 1, 1), (0, 2, 1)]),  # all short: unchanged
    ],
)
def test_smooth_runs(runs, min_len, expected):
    out = R.smooth_runs(runs, min_len)
    assert out == expected
    assert sum(n for *_, n in out) == sum(n for *_, n in runs)  # no step lost


def test_smooth_runs_on_rle_roundtrip():
    seq = [0, 0, 0, 1, 0, 0, 2, 2, 2, 1]
    assert R.smooth_runs(R.rle(seq), 2) == [(0, 0, 6), (2, 6, 4)]


# ------------------------------------------------------------------------------------------------ Spark runs


def test_run_lengths_hand_computed(spark):
    df = make_phases(
        spark,
        [
            ("a", "s1", [None, 0, 0, None, 0, 1, 1, 2]),
            ("b", "s2", [None, None, 1, 0, 0]),
        ],
    )
    seq = B.run_lengths(df)
    assert seq.schema == PHASE_SEQUENCES

    def ts(i):
        return T0 + timedelta(seconds=DT * i)

    expected = [
        ("a", "s1", 0, 0, ts(1), ts(4), 1, 4, 3, 90.0),
        ("a", "s1", 1, 1, ts(5), ts(6), 5, 6, 2, 30.0),
        ("a", "s1", 2, 2, ts(7), ts(7), 7, 7, 1, 0.0),
        ("b", "s2", 0, 1, ts(2), ts(2), 2, 2, 1, 0.0),
        ("b", "s2", 1, 0, ts(3), ts(4), 3, 4, 2, 30.0),
    ]
    assert runs_of(seq) == expected


def test_run_lengths_smoothing(spark):
    df = make_phases(spark, [("c", "s1", [0, 0, 0, 1, 0, 0, 2, 2, 2, None, 1]), ("d", "s1", [5])])
    seq = B.run_lengths(df, min_run_steps=2)
    assert seq.schema == PHASE_SEQUENCES

    def ts(i):
        return T0 + timedelta(seconds=DT * i)

    assert runs_of(seq) == [
        ("c", "s1", 0, 0, ts(0), ts(5), 0, 5, 6, 150.0),
        ("c", "s1", 1, 2, ts(6), ts(10), 6, 10, 4, 120.0),
        ("d", "s1", 0, 5, ts(0), ts(0), 0, 0, 1, 0.0),  # too short but alone: kept
    ]


@pytest.mark.parametrize("min_len", [2, 3, 7])
def test_smoothing_in_spark_equals_the_pandas_reference(spark, min_len):
    """The window-function smoothing gives, to the bit, what smooth_container_runs (pandas, one container at a
    time over smooth_runs) gives: random sequences with leading short runs, no long run at all, nulls, and
    sub-second timestamps (duration_seconds as Timedelta.total_seconds())."""
    import pandas as pd

    rng = np.random.default_rng(min_len)
    rows = []
    for c in range(25):
        n, phase, t = int(rng.integers(1, 120)), None, T0
        for i in range(n):
            t += timedelta(seconds=DT, microseconds=int(rng.integers(0, 1_000_000)))
            if rng.random() < 0.35:
                phase = int(rng.integers(0, 4))
            label = None if rng.random() < 0.05 else phase
            rows.append((f"p{c}", f"s{c % 2}", t, i, label, None, None, 1.0, 4.0, 1.0, 1e9, None, "m1"))
    df = spark.createDataFrame(rows, PHASES)
    smoothed = B.run_lengths(df, min_run_steps=min_len).toPandas()
    raw = B.run_lengths(df).toPandas()
    expected = pd.concat([B.smooth_container_runs(g, min_len) for _, g in raw.groupby(["pod_id", "service"])])
    key = ["pod_id", "service", "run"]
    pd.testing.assert_frame_equal(
        smoothed.sort_values(key).reset_index(drop=True), expected.sort_values(key).reset_index(drop=True),
        check_exact=True, check_dtype=False,
    )
    assert len(smoothed) < len(raw)


# ------------------------------------------------------------------------------------------------ transitions


@pytest.fixture(scope="module")
def ab_sequences(spark):
    df = make_phases(spark, [("A", "s1", [0, 0, 1, 1, 2]), ("B", "s2", [0, 1, 0])])
    return B.run_lengths(df).cache()


def test_transition_counts(ab_sequences):
    tr = B.transition_counts(ab_sequences)
    assert tr.schema == B.TRANSITIONS
    got = {(r.src, r.dst): (r["count"], r.probability) for r in tr.collect()}
    assert got == {(0, 1): (2, 1.0), (1, 2): (1, 0.5), (1, 0): (1, 0.5)}
    by_src: dict[int, float] = {}
    for (src, _), (_, p) in got.items():
        by_src[src] = by_src.get(src, 0.0) + p
    assert all(math.isclose(v, 1.0) for v in by_src.values())


def test_dwell_stats(ab_sequences):
    dw = B.dwell_stats(ab_sequences)
    assert dw.schema == B.DWELL
    got = {r.phase: (r.runs, r.mean_dwell_steps, r.mean_dwell_seconds) for r in dw.collect()}
    # phase 0: A 2 steps (30 s), B 1 + 1 steps (0 s); phase 1: A 2 (30 s), B 1 (0 s); phase 2: A 1 (0 s)
    assert got == {0: (3, 4 / 3, 10.0), 1: (2, 1.5, 15.0), 2: (1, 1.0, 0.0)}


def test_transition_graph(ab_sequences):
    g = G.transition_graph(B.transition_counts(ab_sequences).toPandas(), B.dwell_stats(ab_sequences).toPandas())
    assert sorted(g.nodes) == [0, 1, 2]
    assert g.nodes[0]["runs"] == 3 and math.isclose(g.nodes[0]["mean_dwell_steps"], 4 / 3)
    assert g.nodes[1]["mean_dwell_seconds"] == 15.0
    assert sorted(g.edges) == [(0, 1), (1, 0), (1, 2)]
    assert g.edges[0, 1] == {"count": 2, "probability": 1.0}
    assert g.edges[1, 2]["probability"] == 0.5
    for n in g.nodes:
        out = [d["probability"] for *_, d in g.out_edges(n, data=True)]
        assert not out or math.isclose(sum(out), 1.0)


# ------------------------------------------------------------------------------------------------ prototypes


def test_container_paths_and_counts(spark, ab_sequences):
    paths = {r.pod_id: list(r.path) for r in B.container_phase_paths(ab_sequences).collect()}
    assert paths == {"A": [0, 1, 2], "B": [0, 1, 0]}
    assert sorted(B.collect_path_counts(ab_sequences)) == [((0, 1, 0), 1), ((0, 1, 2), 1)]
    assert B.collect_path_counts(ab_sequences, max_depth=2) == [((0, 1), 2)]


PATHS = [(0, 1, 2)] * 5 + [(0, 1)] * 3 + [(0, 2)] * 1 + [(3,)] * 1


def test_prototype_tree_counts():
    pairs = [((0, 1, 2), 5), ((0, 1), 3), ((0, 2), 1), ((3,), 1)]
    for inp in (PATHS, pairs, dict(pairs)):
        t = G.prototype_tree(inp)
        assert t.nodes["root"]["count"] == 10 and t.nodes["root"]["depth"] == 0
        assert t.nodes["root/0"]["count"] == 9
        assert t.nodes["root/0/1"] == {"phase": 1, "depth": 2, "count": 8, "ends": 3}
        assert t.nodes["root/0/1/2"]["count"] == 5 and t.nodes["root/0/1/2"]["ends"] == 5
        assert t.edges["root/0", "root/0/1"]["count"] == 8
        for n in t.nodes:
            child = sum(t.nodes[c]["count"] for c in t.successors(n))
            assert child <= t.nodes[n]["count"]
            assert t.nodes[n]["count"] == child + t.nodes[n]["ends"]
    shallow = G.prototype_tree(pairs, max_depth=1)
    assert max(d["depth"] for _, d in shallow.nodes(data=True)) == 1
    assert shallow.nodes["root/0"]["ends"] == 9


def test_top_prototypes():
    top = G.top_prototypes(PATHS, n=2)
    assert top == [((0, 1, 2), 5, 0.5), ((0, 1), 3, 0.3)]
    assert math.isclose(G.coverage(top), 0.8)
    allp = G.top_prototypes(PATHS, n=10)
    assert len(allp) == 4 and math.isclose(G.coverage(allp), 1.0)
    assert [p.path for p in allp[2:]] == [(0, 2), (3,)]  # ties broken by path
    assert G.top_prototypes([], n=3) == []


# ------------------------------------------------------------------------------------------------ export


def test_write_and_draw_graph(tmp_path, ab_sequences):
    g = G.transition_graph(B.transition_counts(ab_sequences).toPandas(), B.dwell_stats(ab_sequences).toPandas())
    graphml, js = G.write_graph(g, tmp_path / "out" / "transitions")
    back = nx.read_graphml(graphml, node_type=int)
    assert sorted(back.edges) == sorted(g.edges)
    assert back.edges[0, 1]["count"] == 2 and back.edges[0, 1]["probability"] == 1.0
    assert math.isclose(back.nodes[0]["mean_dwell_steps"], 4 / 3)
    data = json.loads(js.read_text())
    assert {n["id"] for n in data["nodes"]} == {0, 1, 2}
    assert sorted(G.read_graph_json(js).edges) == sorted(g.edges)

    png = plots.draw_graph(g, tmp_path / "out" / "transitions.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1024

    tree = G.prototype_tree(PATHS)
    tml, tjs = G.write_graph(tree, tmp_path / "tree")
    assert nx.read_graphml(tml).nodes["root/0/1"]["count"] == 8
    assert plots.draw_graph(tree, tmp_path / "tree.png").stat().st_size > 1024


def test_a_prototype_tree_draws_its_top_executions_with_labels_that_do_not_overlap():
    """A bushy tree (40 executions, long phase names): the drawing keeps the 8 most common, and no two node
    labels overlap on the rendered canvas; the names are listed once, beside it."""
    rng = np.random.default_rng(3)
    paths = [(tuple(int(v) for v in rng.integers(0, 6, 4)), int(c)) for c in rng.integers(1, 50, 40)]
    tree = G.name_nodes(G.prototype_tree(paths), {p: f"phase {p} with a long descriptive name, memory heavy and rising"
                                                  for p in range(6)})
    top = plots.top_of_tree(tree, 8)
    assert sum(1 for n in top if top.out_degree(n) == 0) == 8
    fig = plots.graph_figure(tree, "Prototypical executions", max_leaves=8)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    boxes = [t.get_window_extent(renderer) for t in fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == "node-label")]
    assert len(boxes) == top.number_of_nodes()
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not overlapping
    legend = [t.get_text() for t in fig.texts]
    assert any("phase 5 with a long" in t for t in legend)


# ------------------------------------------------------------------------------------------------ phase stats


def test_phase_statistics_and_views(spark, tmp_path):
    cpu_a, mem_a = [1, 2, 3, 4, 10], [100, 200, 300, 400, 1000]
    cpu_b, mem_b = [5, 6], [500, 600]
    df = make_phases(
        spark,
        [
            ("a", "s1", [None, 0, 0, 0, 0, 1], [0] + cpu_a, [0] + mem_a),  # the unlabelled step is not counted
            ("b", "s2", [0, 0], cpu_b, mem_b),
        ],
    )
    seq = B.run_lengths(df)
    stats = phase_statistics(df, seq)
    assert stats.schema == PHASE_STATS
    rows = {(r.service, r.phase): r for r in stats.collect()}
    assert set(rows) == {("s1", 0), ("s1", 1), ("s2", 0), (ALL_SERVICES, 0), (ALL_SERVICES, 1)}

    def check(r, cpu, mem, dwell_steps, dwell_seconds):
        assert r.samples == len(cpu)
        for prefix, vals in (("cpu", cpu), ("mem", mem)):
            v = np.asarray(vals, dtype=float)
            assert math.isclose(r[f"{prefix}_mean"], v.mean())
            assert r[f"{prefix}_max"] == v.max()
            if len(v) > 1:
                assert math.isclose(r[f"{prefix}_std"], v.std(ddof=1))
            else:
                assert r[f"{prefix}_std"] is None  # stddev_samp of one sample
            spread = v.max() - v.min()
            for q in (50, 95, 99):
                got = r[f"{prefix}_p{q}"]
                assert got in set(v.tolist())  # percentile_approx returns an observed value...
                assert abs(got - np.percentile(v, q)) <= spread / max(len(v) - 1, 1) + 1e-9  # ...within a rank
            assert r[f"{prefix}_p50"] <= r[f"{prefix}_p95"] <= r[f"{prefix}_p99"] <= r[f"{prefix}_max"]
        assert math.isclose(r.mean_dwell_steps, dwell_steps)
        assert math.isclose(r.mean_dwell_seconds, dwell_seconds)

    check(rows["s1", 0], cpu_a[:4], mem_a[:4], 4, 90)
    check(rows["s1", 1], cpu_a[4:], mem_a[4:], 1, 0)
    check(rows["s2", 0], cpu_b, mem_b, 2, 30)
    check(rows[ALL_SERVICES, 0], cpu_a[:4] + cpu_b, mem_a[:4] + mem_b, 3, 60)
    check(rows[ALL_SERVICES, 1], cpu_a[4:], mem_a[4:], 1, 0)
    assert {r.phase_name for r in rows.values()} == {"phase 0", "phase 1"}  # a model without names
    named = {r.phase: r.phase_name for r in phase_statistics(df, seq, names={1: "high steady CPU"}).collect()}
    assert named == {0: "phase 0", 1: "high steady CPU"}

    paths = {n: str(tmp_path / n) for n in ("stats", "seq", "tr")}
    for frame, key in ((stats, "stats"), (seq, "seq"), (B.transition_counts(seq), "tr")):
        frame.coalesce(1).write.format("delta").mode("overwrite").save(paths[key])
    views = create_bi_views(spark, *(delta_table(paths[k]) for k in ("stats", "seq", "tr")))
    assert "ai4dl_phase_stats" in views and "ai4dl_phase_share" in views and "ai4dl_phase_transitions" in views
    assert spark.sql("SELECT count(*) FROM ai4dl_phase_stats").first()[0] == 5
    share = {(r.service, r.phase): r.share for r in spark.sql("SELECT * FROM ai4dl_phase_share").collect()}
    assert math.isclose(share["s1", 0], 0.8) and math.isclose(share["s1", 1], 0.2)
    assert math.isclose(share["s2", 0], 1.0)
    assert math.isclose(share[ALL_SERVICES, 0], 6 / 7)
    summary = {(r.service, r.phase): r for r in spark.sql("SELECT * FROM ai4dl_phase_summary").collect()}
    s1 = summary["s1", 0]  # the same statistics in cores, GiB, percent and minutes
    assert s1.steps == rows["s1", 0].samples and s1.share_of_steps_pct == 80.0
    assert math.isclose(s1.mem_mean_gib, round(rows["s1", 0].mem_mean / 2**30, 3))
    assert math.isclose(s1.cpu_p95_cores, round(rows["s1", 0].cpu_p95, 3))
    assert math.isclose(s1.mean_dwell_minutes, round(rows["s1", 0].mean_dwell_seconds / 60, 1))
    tr = spark.sql("SELECT src, dst, count, probability FROM ai4dl_phase_transitions").collect()
    assert [tuple(r) for r in tr] == [(0, 1, 1, 1.0)]
    assert spark.sql("SELECT count(*) FROM ai4dl_phase_sequences").first()[0] == 3  # a: 0, 1; b: 0
