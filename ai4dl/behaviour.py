"""From per-step phases to behaviour: run-length sequences, phase transitions, a transition graph, prototypes.

The AI4DL method reads a container's life as a sequence of *phases* (the CRBM + k-means labels of
:data:`ai4dl.schema.PHASES`). This module turns that per-step labelling into the gold tables and small graphs
that describe how workloads behave:

* :func:`run_lengths` - run-length encode each container's phase sequence in Spark
  (:data:`ai4dl.schema.PHASE_SEQUENCES`), optionally smoothing away runs shorter than ``min_run_steps``;
* :func:`transition_counts` / :func:`dwell_stats` - how often phase *a* is followed by phase *b*, and how long
  a phase lasts once entered;
* :func:`transition_graph` - those two tiny (k x k, k) tables as a :class:`networkx.DiGraph`;
* :func:`container_phase_paths` / :func:`path_counts` / :func:`prototype_tree` / :func:`top_prototypes` - each
  container's sequence of run phases (its *path*), the distinct paths with their counts, and a prefix tree of
  those paths: the workload *prototypes*;
* :func:`write_graph` / :func:`draw_graph` - GraphML + JSON export and a PNG drawing.

Everything fleet-sized stays in Spark; only aggregated results (k x k transitions, k dwell rows, one row per
*distinct* path) are brought to the driver.

Conventions
-----------
* A container is identified by ``(pod_id, service)``; a pod belongs to one service.
* Steps whose ``phase`` is null (no full history yet, e.g. the first ``n_history`` steps of a segment) are
  *ignored*, not treated as a phase: they neither start nor split a run. A null between two equal phases is
  therefore inside that run, and a null between two different phases just sits in the gap between the runs.
* ``duration_steps`` counts the *labelled* steps of a run (nulls excluded), so ``end_step - start_step + 1``
  may exceed it when nulls fall inside the run.
* ``duration_seconds`` is ``end_ts - start_ts`` in seconds: 0 for a one-step run. It is the time between the
  first and the last sample of the run, not that span plus one sampling interval.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ai4dl.schema import DWELL, PHASE_SEQUENCES, POD_ID, SERVICE, TRANSITIONS, TS

CONTAINER = (POD_ID, SERVICE)
ROOT = "root"
ROOT_PHASE = -1  # the prototype tree's root has no phase; GraphML cannot store None

Run = tuple[int, int, int]  # (phase, start_index, length)


# --------------------------------------------------------------------------------------------------------------
# Pure run-length helpers (no Spark)
# --------------------------------------------------------------------------------------------------------------


def rle(phases: Sequence[int | None]) -> list[Run]:
    """Run-length encode a phase sequence: ``[(phase, start_index, length), ...]``.

    ``None`` entries are skipped exactly as :func:`run_lengths` skips null phases: they do not split a run and
    are not counted in its length; ``start_index`` is the position in the *input* sequence of the run's first
    labelled element.

    >>> rle([0, 0, 1, None, 1, 2])
    [(0, 0, 2), (1, 2, 2), (2, 5, 1)]
    """
    runs: list[list[int]] = []
    for i, p in enumerate(phases):
        if p is None:
            continue
        p = int(p)
        if runs and runs[-1][0] == p:
            runs[-1][2] += 1
        else:
            runs.append([p, i, 1])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def smooth_runs(runs: Sequence[Run], min_len: int) -> list[Run]:
    """Absorb runs shorter than ``min_len`` into a neighbour, then merge equal neighbours.

    Deterministic rules, decided on the *original* lengths:

    * a run with ``length >= min_len`` is *long* and survives (possibly grown);
    * a short run after a long one is absorbed into the closest preceding long run (that run's phase, its
      length grows by the short run's length);
    * short runs before the first long run are absorbed into that first long run (whose start moves back to
      the first short run's start);
    * afterwards adjacent runs of the same phase are merged (``0x5, 1x1, 0x5`` -> ``0x11``);
    * if no run is long (the whole sequence is shorter than the minimum), the runs are returned unchanged
      apart from merging equal neighbours: there is nothing trustworthy to absorb them into.

    ``min_len <= 1`` returns the runs unchanged (merged). Runs are ``(phase, start, length)`` tuples as from
    :func:`rle`, given in order; a merged run keeps the start of its first constituent.

    >>> smooth_runs([(0, 0, 5), (1, 5, 1), (0, 6, 5)], 2)
    [(0, 0, 11)]
    >>> smooth_runs([(3, 0, 1), (0, 1, 4), (1, 5, 1)], 2)
    [(0, 0, 6)]
    """
    runs = [(int(p), int(s), int(n)) for p, s, n in runs]
    if min_len > 1 and any(n >= min_len for _, _, n in runs):
        out: list[list[int]] = []
        pending_start: int | None = None
        pending_len = 0
        for p, s, n in runs:
            if n >= min_len:
                if pending_start is not None:  # leading short runs join the first long run
                    out.append([p, pending_start, pending_len + n])
                    pending_start, pending_len = None, 0
                else:
                    out.append([p, s, n])
            elif out:
                out[-1][2] += n
            else:
                if pending_start is None:
                    pending_start = s
                pending_len += n
        runs = [tuple(r) for r in out]  # type: ignore[misc]
    return _merge_equal(runs)


def _merge_equal(runs: Iterable[Run]) -> list[Run]:
    out: list[list[int]] = []
    for p, s, n in runs:
        if out and out[-1][0] == p:
            out[-1][2] += n
        else:
            out.append([p, s, n])
    return [tuple(r) for r in out]  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------------------
# Spark: sequences, transitions, dwell
# --------------------------------------------------------------------------------------------------------------


def _zero(dtype: T.DataType) -> Column:
    if isinstance(dtype, T.StringType):
        return F.lit("")
    if isinstance(dtype, T.TimestampType):
        return F.lit(datetime(1970, 1, 1)).cast(T.TimestampType())
    if isinstance(dtype, T.DateType):
        return F.lit("1970-01-01").cast(T.DateType())
    if isinstance(dtype, T.BooleanType):
        return F.lit(False)
    return F.lit(0).cast(dtype)


def conform(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Select ``schema``'s columns in order, cast to its types, with its nullability.

    Spark marks every aggregate result nullable; for a required field this wraps the column in
    ``coalesce(col, <typed zero>)``, which only changes the declared nullability: the callers in this package
    only conform columns that are non-null by construction (group keys of required columns, counts, min/max
    of non-empty groups), so the zero is never produced.
    """
    cols = []
    current = {f.name: f for f in df.schema.fields}
    for f in schema.fields:
        c = F.col(f"`{f.name}`")
        if current[f.name].dataType != f.dataType:
            c = c.cast(f.dataType)
        if not f.nullable and current[f.name].nullable:
            c = F.coalesce(c, _zero(f.dataType))
        cols.append(c.alias(f.name))
    return df.select(*cols)


def _seconds_between(start: Column, end: Column) -> Column:
    return ((F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)).cast(T.DoubleType())


def run_lengths(phases_df: DataFrame, min_run_steps: int = 1) -> DataFrame:
    """Run-length encoded phase sequence of every container, in the :data:`~ai4dl.schema.PHASE_SEQUENCES` schema.

    Per container ``(pod_id, service)``, labelled steps (``phase`` not null) are ordered by ``step``; a run id
    is the running sum of "phase differs from the previous labelled step" (``lag`` + cumulative ``sum`` over a
    window), so a null phase never splits a run (see the module notes). Each run gets its first/last ``ts`` and
    ``step``, ``duration_steps`` (labelled steps) and ``duration_seconds`` (``end_ts - start_ts``).

    ``min_run_steps > 1`` smooths the sequence with :func:`smooth_runs` (short runs absorbed into the previous
    long run, or the next when they lead; then equal neighbours merged and runs renumbered). The smoothing is a
    grouped pandas UDF over each container's *runs* (not its steps), so it moves only a container's handful of
    runs through Arrow.
    """
    w = Window.partitionBy(*CONTAINER).orderBy("step")
    labelled = phases_df.where(F.col("phase").isNotNull()).select(*CONTAINER, TS, "step", "phase")
    flagged = labelled.withColumn(
        "_new",
        F.when(F.lag("phase").over(w).eqNullSafe(F.col("phase")), F.lit(0)).otherwise(F.lit(1)),
    )
    with_run = flagged.withColumn(
        "run", (F.sum("_new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)) - 1).cast("int")
    )
    runs = with_run.groupBy(*CONTAINER, "run").agg(
        F.first("phase").alias("phase"),  # constant within a run
        F.min_by(TS, "step").alias("start_ts"),
        F.max_by(TS, "step").alias("end_ts"),
        F.min("step").alias("start_step"),
        F.max("step").alias("end_step"),
        F.count(F.lit(1)).cast("int").alias("duration_steps"),
    )
    runs = runs.withColumn("duration_seconds", _seconds_between(F.col("start_ts"), F.col("end_ts")))
    runs = conform(runs, PHASE_SEQUENCES)
    if min_run_steps is None or min_run_steps <= 1:
        return runs
    min_len = int(min_run_steps)

    def _smooth(pdf: pd.DataFrame) -> pd.DataFrame:
        return smooth_container_runs(pdf, min_len)

    return conform(runs.groupBy(*CONTAINER).applyInPandas(_smooth, schema=PHASE_SEQUENCES), PHASE_SEQUENCES)


def smooth_container_runs(pdf: pd.DataFrame, min_len: int) -> pd.DataFrame:
    """:func:`smooth_runs` applied to one container's runs (PHASE_SEQUENCES rows), as a pandas frame.

    Positions handed to :func:`smooth_runs` are cumulative labelled-step offsets, so every smoothed run maps back
    to a contiguous block of original runs: its phase from the smoothing, its ``start_*`` from the first run of
    the block, ``end_*`` from the last, ``duration_steps`` summed, ``duration_seconds`` recomputed.
    """
    cols = [f.name for f in PHASE_SEQUENCES.fields]
    if pdf.empty:
        return pdf[cols]
    pdf = pdf.sort_values("run").reset_index(drop=True)
    lengths = pdf["duration_steps"].astype(int).tolist()
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    smoothed = smooth_runs(list(zip(pdf["phase"].astype(int).tolist(), offsets, lengths)), min_len)
    rows = []
    first = 0
    for i, (phase, start, length) in enumerate(smoothed):
        end_off = start + length
        last = first
        while last + 1 < len(offsets) and offsets[last + 1] < end_off:
            last += 1
        a, b = pdf.iloc[first], pdf.iloc[last]
        rows.append(
            {
                POD_ID: a[POD_ID],
                SERVICE: a[SERVICE],
                "run": i,
                "phase": int(phase),
                "start_ts": a["start_ts"],
                "end_ts": b["end_ts"],
                "start_step": int(a["start_step"]),
                "end_step": int(b["end_step"]),
                "duration_steps": int(length),
                "duration_seconds": float((pd.Timestamp(b["end_ts"]) - pd.Timestamp(a["start_ts"])).total_seconds()),
            }
        )
        first = last + 1
    out = pd.DataFrame(rows, columns=cols)
    for c in ("run", "phase", "start_step", "end_step", "duration_steps"):
        out[c] = out[c].astype("int32")
    return out





def transition_counts(sequences_df: DataFrame) -> DataFrame:
    """Phase-to-phase transitions between consecutive runs of each container (:data:`TRANSITIONS` schema).

    ``count`` is the number of times a run of ``src`` is directly followed by a run of ``dst`` (fleet-wide), and
    ``probability = count / sum(count for that src)``, the empirical ``P(next = dst | leaving src)``. Only real
    changes appear (consecutive runs differ by construction); a container's first run has no incoming and its
    last run no outgoing transition, so a phase seen only at the end of lives has no ``src`` row.
    """
    w = Window.partitionBy(*CONTAINER).orderBy("run")
    pairs = sequences_df.select(F.col("phase").alias("src"), F.lead("phase").over(w).alias("dst")).where(
        F.col("dst").isNotNull()
    )
    counts = pairs.groupBy("src", "dst").agg(F.count(F.lit(1)).alias("count"))
    counts = counts.withColumn(
        "probability", F.col("count") / F.sum("count").over(Window.partitionBy("src"))
    )
    return conform(counts, TRANSITIONS)


def dwell_stats(sequences_df: DataFrame) -> DataFrame:
    """Per phase: ``runs`` (how many runs of it), ``mean_dwell_steps``, ``mean_dwell_seconds`` (:data:`DWELL`)."""
    agg = sequences_df.groupBy("phase").agg(
        F.count(F.lit(1)).alias("runs"),
        F.avg("duration_steps").alias("mean_dwell_steps"),
        F.avg("duration_seconds").alias("mean_dwell_seconds"),
    )
    return conform(agg, DWELL)


# --------------------------------------------------------------------------------------------------------------
# Graphs
# --------------------------------------------------------------------------------------------------------------


def _py(value: Any) -> Any:
    """numpy / pandas scalars -> plain Python (GraphML and JSON writers want builtins)."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        try:
            return value.item()
        except (AttributeError, ValueError):
            return value
    return value


def transition_graph(transitions_pdf: pd.DataFrame, dwell_pdf: pd.DataFrame | None = None) -> nx.DiGraph:
    """The phase transition graph: nodes = phases, edges = observed transitions.

    Node ids are the integer phases, with attributes ``runs``, ``mean_dwell_steps``, ``mean_dwell_seconds``
    from ``dwell_pdf`` (``dwell_stats(...).toPandas()``); edges ``src -> dst`` carry ``count`` and
    ``probability`` from ``transitions_pdf`` (``transition_counts(...).toPandas()``). A phase that only occurs
    in a transition but not in ``dwell_pdf`` gets zero dwell attributes.
    """
    g = nx.DiGraph(kind="phase_transitions")
    if dwell_pdf is not None:
        for r in dwell_pdf.itertuples(index=False):
            g.add_node(
                int(r.phase),
                phase=int(r.phase),
                runs=int(r.runs),
                mean_dwell_steps=float(r.mean_dwell_steps),
                mean_dwell_seconds=float(r.mean_dwell_seconds),
            )
    for r in transitions_pdf.itertuples(index=False):
        for p in (int(r.src), int(r.dst)):
            if p not in g:
                g.add_node(p, phase=p, runs=0, mean_dwell_steps=0.0, mean_dwell_seconds=0.0)
        g.add_edge(int(r.src), int(r.dst), count=int(r.count), probability=float(r.probability))
    return g


def container_phase_paths(sequences_df: DataFrame) -> DataFrame:
    """Each container's *path*: ``pod_id``, ``service``, ``path`` (array<int> of run phases, ordered by run)."""
    agg = sequences_df.groupBy(*CONTAINER).agg(F.sort_array(F.collect_list(F.struct("run", "phase"))).alias("_runs"))
    return agg.select(*CONTAINER, F.transform("_runs", lambda s: s["phase"]).alias("path"))


def path_counts(sequences_df: DataFrame, max_depth: int | None = None) -> DataFrame:
    """Distinct paths and how many containers follow each: ``path`` array<int>, ``count`` long.

    With ``max_depth`` the paths are cut to their first ``max_depth`` runs before counting. This is the only
    prototype input that goes to the driver: one row per distinct path, never one per container.
    """
    paths = container_phase_paths(sequences_df)
    if max_depth is not None:
        paths = paths.withColumn("path", F.slice("path", 1, int(max_depth)))
    return paths.groupBy("path").count()


def collect_path_counts(sequences_df: DataFrame, max_depth: int | None = None) -> list[tuple[tuple[int, ...], int]]:
    """:func:`path_counts` on the driver as ``[(path_tuple, count), ...]``, input for :func:`prototype_tree`."""
    return [(tuple(int(p) for p in r["path"]), int(r["count"])) for r in path_counts(sequences_df, max_depth).collect()]


def _weighted_paths(sequences: Any) -> list[tuple[tuple[int, ...], int]]:
    """Normalise the accepted inputs to ``[(path, count)]``.

    Accepted: a mapping ``path -> count``; a pandas frame with ``path`` and ``count`` columns; or an iterable
    whose items are either a path (a sequence of ints, weight 1) or a ``(path, count)`` pair (a 2-sequence whose
    first element is itself a sequence, e.g. a ``Row(path=[...], count=n)`` from :func:`path_counts`).
    """
    if isinstance(sequences, pd.DataFrame):
        sequences = zip(sequences["path"], sequences["count"])
    elif isinstance(sequences, Mapping):
        sequences = sequences.items()
    out = []
    for item in sequences:
        if hasattr(item, "__len__") and len(item) == 2 and hasattr(item[0], "__iter__"):
            path, count = item[0], int(item[1])
        else:
            path, count = item, 1
        out.append((tuple(int(p) for p in path), count))
    return out


def prototype_tree(sequences: Any, max_depth: int | None = None) -> nx.DiGraph:
    """Prefix tree (trie) of container paths: the workload prototypes.

    ``sequences``: paths (tuples of run phases, one per container) or ``(path, count)`` pairs - see
    :func:`_weighted_paths`; pairs let the tree be built from :func:`collect_path_counts` alone.

    Node ``"root"`` has ``phase = -1`` (:data:`ROOT_PHASE`), ``depth = 0`` and ``count`` = number of containers.
    Every other node stands for a path prefix, id ``"root/p1/p2/..."``, with ``phase`` (its last phase),
    ``depth`` (prefix length), ``count`` (containers whose path starts with the prefix) and ``ends``
    (containers whose path is exactly the prefix, after the ``max_depth`` cut). Edges parent -> child carry
    ``count`` (= the child's). Hence ``count(node) = ends(node) + sum(count(children))``.
    """
    g = nx.DiGraph(kind="prototype_tree")
    g.add_node(ROOT, phase=ROOT_PHASE, depth=0, count=0, ends=0)
    for path, count in _weighted_paths(sequences):
        if max_depth is not None:
            path = path[: int(max_depth)]
        g.nodes[ROOT]["count"] += count
        parent = ROOT
        for depth, phase in enumerate(path, start=1):
            node = f"{parent}/{phase}"
            if node not in g:
                g.add_node(node, phase=int(phase), depth=depth, count=0, ends=0)
                g.add_edge(parent, node, count=0)
            g.nodes[node]["count"] += count
            g.edges[parent, node]["count"] += count
            parent = node
        g.nodes[parent]["ends"] += count
    return g


class Prototype(NamedTuple):
    path: tuple[int, ...]
    count: int
    share: float  # count / all containers


def top_prototypes(sequences: Any, n: int = 5) -> list[Prototype]:
    """The ``n`` most common complete paths as ``(path, count, share)``, most common first.

    ``share`` is the path's fraction of all containers; the cumulative share covered by the returned
    prototypes is ``sum(p.share for p in result)`` (see :func:`coverage`). Ties are broken by the path, so the
    result is deterministic. Input as for :func:`prototype_tree`.
    """
    totals: dict[tuple[int, ...], int] = {}
    for path, count in _weighted_paths(sequences):
        totals[path] = totals.get(path, 0) + count
    total = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[: max(int(n), 0)]
    return [Prototype(path, count, count / total if total else 0.0) for path, count in ranked]


def coverage(prototypes: Iterable[Prototype]) -> float:
    """Cumulative share of containers covered by some prototypes (e.g. :func:`top_prototypes`)."""
    return float(sum(p.share for p in prototypes))


# --------------------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------------------


def _graphml_value(value: Any) -> Any:
    value = _py(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str)


def _sanitised(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy whose graph/node/edge attributes are builtins (None dropped, containers as JSON text)."""
    g = graph.__class__()
    g.graph.update({k: _graphml_value(v) for k, v in graph.graph.items() if v is not None})
    for node, data in graph.nodes(data=True):
        g.add_node(_py(node), **{k: _graphml_value(v) for k, v in data.items() if v is not None})
    for u, v, data in graph.edges(data=True):
        g.add_edge(_py(u), _py(v), **{k: _graphml_value(x) for k, x in data.items() if x is not None})
    return g


def write_graph(graph: nx.DiGraph, path_prefix: str | Path) -> tuple[Path, Path]:
    """Write ``<prefix>.graphml`` and ``<prefix>.json`` (networkx ``node_link_data``, edges under ``"edges"``).

    Attributes are converted to JSON/GraphML-safe builtins first. GraphML stores node ids as strings (read back
    with ``nx.read_graphml(path, node_type=int)`` for the phase graph); the JSON keeps integer ids.
    Returns the two paths.
    """
    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    g = _sanitised(graph)
    graphml = prefix.with_name(prefix.name + ".graphml")
    js = prefix.with_name(prefix.name + ".json")
    nx.write_graphml(g, graphml)
    js.write_text(json.dumps(nx.node_link_data(g, edges="edges"), indent=2, sort_keys=True))
    return graphml, js


def read_graph_json(path: str | Path) -> nx.DiGraph:
    """Inverse of the JSON half of :func:`write_graph`."""
    return nx.node_link_graph(json.loads(Path(path).read_text()), edges="edges")


def draw_graph(graph: nx.DiGraph, png_path: str | Path, title: str | None = None) -> Path:
    """Draw a phase graph (or prototype tree) to a PNG with matplotlib's Agg canvas (no global backend change).

    Node size grows with ``mean_dwell_steps`` (falling back to ``count``), edge width with ``probability``
    (falling back to ``count`` relative to the largest). Node labels show the phase and mean dwell; edge labels
    the probability. The layout is seeded, so the same graph draws the same picture.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(7, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()
    if title or graph.graph.get("kind"):
        ax.set_title(title or str(graph.graph.get("kind")))
    if graph.number_of_nodes() == 0:
        ax.text(0.5, 0.5, "(empty graph)", ha="center", va="center")
        fig.savefig(png)
        return png

    nodes = list(graph.nodes)

    def _node_weight(n: Any) -> float:
        d = graph.nodes[n]
        return float(d.get("mean_dwell_steps", d.get("count", 1)) or 0.0)

    weights = [_node_weight(n) for n in nodes]
    wmax = max(weights) or 1.0
    sizes = [300 + 2200 * w / wmax for w in weights]

    edges = list(graph.edges)
    if edges and all("probability" in graph.edges[e] for e in edges):
        widths = [0.5 + 5.0 * float(graph.edges[e]["probability"]) for e in edges]
        edge_labels = {e: f"{float(graph.edges[e]['probability']):.2f}" for e in edges}
    else:
        counts = [float(graph.edges[e].get("count", 1)) for e in edges]
        cmax = max(counts, default=1.0) or 1.0
        widths = [0.5 + 5.0 * c / cmax for c in counts]
        edge_labels = {e: str(graph.edges[e].get("count", "")) for e in edges}

    def _label(n: Any) -> str:
        d = graph.nodes[n]
        phase = d.get("phase", n)
        head = "root" if phase == ROOT_PHASE else f"phase {phase}"
        if "mean_dwell_steps" in d:
            return f"{head}\n{float(d['mean_dwell_steps']):.1f} steps"
        if "count" in d:
            return f"{head}\nn={d['count']}"
        return head

    if graph.graph.get("kind") == "prototype_tree":
        pos = _tree_layout(graph)
    else:
        pos = nx.circular_layout(graph) if len(nodes) <= 2 else nx.spring_layout(graph, seed=7, k=1.5)
    nx.draw_networkx_nodes(graph, pos, nodelist=nodes, node_size=sizes, node_color="#9ecae1", edgecolors="#3182bd", ax=ax)
    nx.draw_networkx_labels(graph, pos, labels={n: _label(n) for n in nodes}, font_size=8, ax=ax)
    if edges:
        nx.draw_networkx_edges(
            graph, pos, edgelist=edges, width=widths, arrows=True, arrowsize=14,
            connectionstyle="arc3,rad=0.12", node_size=sizes, ax=ax,
        )
        nx.draw_networkx_edge_labels(graph, pos, edge_labels=edge_labels, font_size=7, ax=ax,
                                     connectionstyle="arc3,rad=0.12")
    fig.tight_layout()
    fig.savefig(png)
    return png


def _tree_layout(tree: nx.DiGraph) -> dict[Any, tuple[float, float]]:
    """Top-down layout: depth on y, leaves spread evenly on x, parents centred over their children."""
    pos: dict[Any, tuple[float, float]] = {}
    next_x = [0.0]

    def place(node: Any, depth: int) -> float:
        children = sorted(tree.successors(node), key=str)
        if not children:
            x = next_x[0]
            next_x[0] += 1.0
        else:
            xs = [place(c, depth + 1) for c in children]
            x = sum(xs) / len(xs)
        pos[node] = (x, -float(depth))
        return x

    roots = [n for n in tree.nodes if tree.in_degree(n) == 0] or list(tree.nodes)[:1]
    for r in roots:
        place(r, 0)
    return pos
