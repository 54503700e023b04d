"""The phase transition graph and the prototype tree, as small networkx graphs built from aggregated tables.

Input sizes are k x k transitions, k dwell rows and one row per *distinct* path: no Spark here, so the graphs
are built and tested on the driver alone. GraphML + JSON export live here; drawing is in
:mod:`ai4dl.reporting.plots`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
import pandas as pd

ROOT = "root"


ROOT_PHASE = -1  # the prototype tree's root has no phase; GraphML cannot store None


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


def name_nodes(graph: nx.DiGraph, names: Mapping[int, str]) -> nx.DiGraph:
    """Give every node whose phase has a name a ``name`` attribute (kept in GraphML/JSON, drawn by
    :func:`ai4dl.reporting.plots.draw_graph`); returns the same graph."""
    for node, data in graph.nodes(data=True):
        try:
            phase = int(data.get("phase", node))
        except (TypeError, ValueError):
            continue
        if phase in names:
            data["name"] = str(names[phase])
    return graph


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

