"""Next-phase prediction from the phase transitions: the one rule both the score of how well transitions
predict a container's next phase (:func:`next_phase_f1`, printed by ``ai4dl policies``) and the live
recommendations' "next phase" (:mod:`ai4dl.stream`) use. (``phase.proactive`` reads the fleet's probabilities
alone, :mod:`ai4dl.policies.rules`.)

Containers of one service run one job template, and a template repeats its own cycle (training, evaluation,
checkpoint at its own levels), which the fleet's transitions average away. So a prediction for a container of a
known service reads that service's transition counts, shrunk towards the fleet's probabilities by
:data:`SERVICE_PRIOR` pseudo-counts: ``score(q) = n_service(p -> q) + SERVICE_PRIOR * P_fleet(p -> q)``. A service
seen rarely (or never) leaving ``p`` predicts what the fleet does; one seen often predicts its own habit. Chosen on
development fleets only (``bench/README.md``, "each service's own cycle"): the learned phases' next-phase F1 on
held-out run ends went 0.687 -> 0.874 and 0.571 -> 0.843 on two ``training-loop`` fleets and 0.409 -> 0.421 on an
``ai4dl`` one, within 0.011 for any prior from 1 to 10 pseudo-counts; the fleet's table alone (prior -> infinity)
is the earlier rule. On the true behaviours of the ``ai4dl`` fleets (whose services share one random cycle) it
predicts a little worse than the fleet's table (0.444 -> 0.427 on the development fleet).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ai4dl.errors import InputError
from ai4dl.policies.rules import finite_value, phase_codes

SERVICE_PRIOR = 3.0
"""Pseudo-counts of the fleet's transition probabilities added to a service's own counts (see the module)."""


def normalise_transitions(transitions: Any) -> dict[int, dict[int, float]]:
    """``{src: {dst: probability}}`` from ``{(src, dst): probability}`` or a ``phase_transitions`` table
    (pandas, or a small Spark DataFrame, with ``src``, ``dst``, ``probability``). Keys that are not phase numbers
    and non-finite probabilities are dropped; None gives ``{}``."""
    if transitions is None:
        return {}
    if _is_normalised(transitions):  # already {src: {dst: probability}} (a policy model's, JSON's string keys)
        transitions = {(src, dst): p for src, dsts in transitions.items() for dst, p in dsts.items()}
    if hasattr(transitions, "toPandas"):
        transitions = transitions.toPandas()
    if isinstance(transitions, pd.DataFrame):
        missing = [c for c in ("src", "dst", "probability") if c not in transitions.columns]
        if missing:
            raise InputError(f"phase transitions lack column(s) {missing} (have: {list(transitions.columns)})")
        items = zip(zip(transitions["src"], transitions["dst"]), transitions["probability"])
    else:
        items = transitions.items()
    out: dict[int, dict[int, float]] = {}
    for key, prob in items:
        try:
            src, dst = (int(k) for k in key)
        except (TypeError, ValueError):
            continue
        p = finite_value(prob)
        if not math.isnan(p):
            out.setdefault(src, {})[dst] = p
    return out


def most_likely_next(phase: Any, transitions: Any, counts: Mapping[int, Mapping[int, float]] | None = None,
                     prior: float = SERVICE_PRIOR) -> tuple[int, float] | None:
    """The most likely phase after a run of ``phase`` and its probability: ``argmax_q P(phase -> q)`` over
    ``q != phase`` (ties: the smallest phase), None for an unknown phase or one without known successors.
    ``transitions`` (the fleet's) as :func:`normalise_transitions` reads them; ``counts``: the container's
    service's own transition counts ``{src: {dst: n}}`` (:func:`normalise_service_transitions`), which the fleet's
    probabilities are added to as ``prior`` pseudo-counts: ``P = (n + prior P_fleet) / (N + prior)`` (the prior
    only where the fleet knows successors of ``phase``).
    The one rule both the next-phase score (:func:`next_phase_f1`) and the live recommendations
    (:mod:`ai4dl.stream`) predict with.

    >>> most_likely_next(0, {(0, 1): 0.7, (0, 2): 0.3, (0, 0): 0.9})
    (1, 0.7)
    >>> nxt, p = most_likely_next(0, {(0, 1): 0.7, (0, 2): 0.3}, counts={0: {2: 4}})
    >>> nxt, round(p, 3)  # 2 over 1: (4 + 3 x 0.3) / (4 + 3) against (0 + 3 x 0.7) / (4 + 3)
    (2, 0.7)
    >>> most_likely_next(None, {(0, 1): 1.0}) is None
    True
    """
    p = finite_value(phase)
    if math.isnan(p):
        return None
    src = int(p)
    successors = transitions if _is_normalised(transitions) else normalise_transitions(transitions)
    fleet = {dst: prob for dst, prob in successors.get(src, {}).items() if dst != src}
    own = {int(dst): float(n) for dst, n in ((counts or {}).get(src) or {}).items()
           if int(dst) != src and finite_value(n) > 0}
    if own:
        total = sum(own.values()) + (prior if fleet else 0.0)
        fleet = {dst: (own.get(dst, 0.0) + prior * fleet.get(dst, 0.0)) / total for dst in set(fleet) | set(own)}
    candidates = [(-prob, dst) for dst, prob in fleet.items()]
    if not candidates:
        return None
    prob, dst = min(candidates)
    return int(dst), -float(prob)


def _is_normalised(transitions: Any) -> bool:
    return isinstance(transitions, dict) and all(isinstance(v, dict) for v in transitions.values())


def f1_scores(boundaries: int, predicted: int, correct: int) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 of next-phase predictions from their counts (NaN when
    undefined), so per-container counts can be summed over a fleet first.

    >>> f1_scores(boundaries=4, predicted=3, correct=2)
    {'precision': 0.6666666666666666, 'recall': 0.5, 'f1': 0.5714285714285715}
    """
    precision = correct / predicted if predicted else math.nan
    recall = correct / boundaries if boundaries else math.nan
    if math.isnan(precision) or math.isnan(recall):
        f1 = math.nan
    elif precision + recall == 0:
        f1 = 0.0
    else:
        f1 = 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1}


def next_phase_f1(phases: Any, transitions: Any, counts: Mapping[int, Mapping[int, float]] | None = None) -> dict[str, float]:
    """How well the transitions predict a container's next phase.

    The phase sequence without its unlabelled steps is cut into runs of one phase. At every run end (a phase
    change, a *boundary*) the prediction for the next run's phase is the ending run's phase's most likely
    successor by :func:`most_likely_next` (the fleet's ``transitions``, with the container's service's own
    ``counts`` when given); a phase without known successors predicts nothing. Over the boundaries: ``correct`` =
    predictions equal to the actual next phase, precision = correct / predicted, recall = correct / boundaries, F1 their harmonic mean
    (micro-averaged over phases: one prediction per boundary). Counts are returned too, for fleet sums.

    >>> scores = next_phase_f1([0, 0, None, 0, 1, 1, 0, 2, 2], {(0, 1): 0.7, (0, 2): 0.3, (1, 0): 1.0})
    >>> scores["boundaries"], scores["predicted"], scores["correct"], round(scores["f1"], 4)
    (3, 3, 2, 0.6667)
    """
    return _scored(phases, next_phase_table(transitions, counts))


def _scored(phases: Any, table: Mapping[int, tuple[int, float]]) -> dict[str, float]:
    """:func:`next_phase_f1` against a next-phase table (:func:`next_phase_table`)."""
    codes = phase_codes(phases)
    codes = codes[~np.isnan(codes)].astype(np.int64)
    runs = codes[np.r_[True, codes[1:] != codes[:-1]]] if codes.size else codes
    best = {src: nxt[0] for src, nxt in table.items()}
    boundaries = max(len(runs) - 1, 0)
    predicted = correct = 0
    for src, dst in zip(runs[:-1].tolist(), runs[1:].tolist()):
        if src in best:
            predicted += 1
            correct += int(best[src] == dst)
    return {"boundaries": boundaries, "predicted": predicted, "correct": correct, **f1_scores(boundaries, predicted, correct)}


def fleet_next_phase_f1(runs: pd.DataFrame, transitions: Any,
                        service_counts: Mapping[str, Mapping[int, Mapping[int, float]]] | None = None) -> dict[str, float]:
    """:func:`next_phase_f1` over many containers' runs (``pod_id``, ``run``, ``phase`` and, with
    ``service_counts`` (:func:`normalise_service_transitions`), ``service``: gold ``phase_sequences`` rows), each
    container scored against the table the stream tells it (its service's, else the fleet's), counts summed
    before the scores (micro-averaged over the fleet's run ends)."""
    totals = {"boundaries": 0, "predicted": 0, "correct": 0}
    if service_counts and "service" not in runs.columns:
        raise InputError(f"runs lack column 'service' to read its transition counts (have: {list(runs.columns)})")
    fleet = next_phase_table(transitions)
    tables = {svc: next_phase_table(transitions, counts) for svc, counts in (service_counts or {}).items()}
    container = ["pod_id", "service"] if "service" in runs.columns else ["pod_id"]
    for key, pod in runs.sort_values([*container, "run"]).groupby(container, dropna=False):
        table = tables.get(str(key[1]), fleet) if len(container) == 2 else fleet
        scores = _scored(pod["phase"].tolist(), table)
        for k in totals:
            totals[k] += int(scores[k])
    return {**totals, **f1_scores(**totals)}


def fleet_transitions(service_counts: pd.DataFrame) -> dict[int, dict[int, float]]:
    """The fleet's ``{src: {dst: probability}}`` from per-service transition counts (pandas rows of ``service``,
    ``src``, ``dst``, ``count``): their sums per transition over each ``src``'s total, what
    :func:`ai4dl.behaviour.sequences.transition_counts` gives for the same runs, without counting them again."""
    fleet = service_counts.groupby(["src", "dst"], as_index=False)["count"].sum()
    fleet["probability"] = fleet["count"] / fleet.groupby("src")["count"].transform("sum")
    return normalise_transitions(fleet)


def normalise_service_transitions(counts: Any) -> dict[str, dict[int, dict[int, int]]]:
    """``{service: {src: {dst: count}}}`` from per-service transition counts (rows of ``service``, ``src``,
    ``dst``, ``count``: :func:`ai4dl.behaviour.sequences.service_transition_counts`, pandas or a small Spark
    DataFrame, or already nested as a policy model stores them with string keys). Rows without a service or a
    phase, and counts that are not positive, are dropped."""
    if counts is None:
        return {}
    if isinstance(counts, Mapping):
        rows = ((svc, src, dst, n) for svc, per in counts.items() for src, dsts in per.items() for dst, n in dsts.items())
    else:
        if hasattr(counts, "toPandas"):
            counts = counts.toPandas()
        missing = [c for c in ("service", "src", "dst", "count") if c not in counts.columns]
        if missing:
            raise InputError(f"service transition counts lack column(s) {missing} (have: {list(counts.columns)})")
        rows = zip(counts["service"], counts["src"], counts["dst"], counts["count"])
    out: dict[str, dict[int, dict[int, int]]] = {}
    for svc, src, dst, n in rows:
        try:
            key, a, b, k = str(svc), int(src), int(dst), int(n)
        except (TypeError, ValueError):
            continue
        if not pd.isna(svc) and k > 0 and a != b:
            out.setdefault(key, {}).setdefault(a, {})[b] = k
    return out


def next_phase_table(transitions: Any, counts: Mapping[int, Mapping[int, float]] | None = None) -> dict[int, tuple[int, float]]:
    """``{phase: (most likely next phase, its probability)}`` for every phase with a known successor, for the
    fleet or, with ``counts`` (its own transition counts), a service's containers: what the live recommendations
    read and the next-phase score is scored against."""
    successors = normalise_transitions(transitions)
    return {src: nxt for src in sorted(set(successors) | set(counts or {}))
            if (nxt := most_likely_next(src, successors, counts)) is not None}


__all__ = ["SERVICE_PRIOR", "f1_scores", "fleet_next_phase_f1", "fleet_transitions", "most_likely_next", "next_phase_f1", "next_phase_table",
           "normalise_service_transitions", "normalise_transitions"]
