"""Next-phase prediction from the phase-transition probabilities: the one rule both the score of how well
transitions predict a container's next phase (:func:`next_phase_f1`, printed by ``ai4dl policies``) and the
live recommendations' "next phase" (:mod:`ai4dl.stream`) use, and what ``phase.proactive`` bets on."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ai4dl.errors import InputError
from ai4dl.policies.rules import finite_value, phase_codes


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


def most_likely_next(phase: Any, transitions: Any) -> tuple[int, float] | None:
    """The most likely phase after a run of ``phase`` and its probability: ``argmax_q P(phase -> q)`` over
    ``q != phase`` (ties: the smallest phase), None for an unknown phase or one without known successors.
    ``transitions`` as :func:`normalise_transitions` reads them. The one rule both the next-phase score
    (:func:`next_phase_f1`) and the live recommendations (:mod:`ai4dl.stream`) predict with.

    >>> most_likely_next(0, {(0, 1): 0.7, (0, 2): 0.3, (0, 0): 0.9})
    (1, 0.7)
    >>> most_likely_next(None, {(0, 1): 1.0}) is None
    True
    """
    p = finite_value(phase)
    if math.isnan(p):
        return None
    successors = transitions if _is_normalised(transitions) else normalise_transitions(transitions)
    candidates = [(-prob, dst) for dst, prob in successors.get(int(p), {}).items() if dst != int(p)]
    if not candidates:
        return None
    prob, dst = min(candidates)
    return int(dst), -float(prob)


def _is_normalised(transitions: Any) -> bool:
    return isinstance(transitions, dict) and all(isinstance(v, dict) for v in transitions.values())


# Policies that read the interval they allocate for: they cannot run live, where that interval is the future.


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


def next_phase_f1(phases: Any, transitions: Any) -> dict[str, float]:
    """How well the transition probabilities predict a container's next phase (what ``phase.proactive`` bets on).

    The phase sequence without its unlabelled steps is cut into runs of one phase. At every run end (a phase
    change, a *boundary*) the prediction for the next run's phase is the most likely successor
    ``argmax_q P(p -> q)`` over ``q != p`` of the ending run's phase ``p`` (ties: the smallest phase); a phase
    without known successors predicts nothing. Over the boundaries: ``correct`` = predictions equal to the
    actual next phase, precision = correct / predicted, recall = correct / boundaries, F1 their harmonic mean
    (micro-averaged over phases: one prediction per boundary). Counts are returned too, for fleet sums.

    >>> scores = next_phase_f1([0, 0, None, 0, 1, 1, 0, 2, 2], {(0, 1): 0.7, (0, 2): 0.3, (1, 0): 1.0})
    >>> scores["boundaries"], scores["predicted"], scores["correct"], round(scores["f1"], 4)
    (3, 3, 2, 0.6667)
    """
    codes = phase_codes(phases)
    codes = codes[~np.isnan(codes)].astype(np.int64)
    runs = codes[np.r_[True, codes[1:] != codes[:-1]]] if codes.size else codes
    successors = normalise_transitions(transitions)
    best = {src: nxt[0] for src in successors if (nxt := most_likely_next(src, successors)) is not None}
    boundaries = max(len(runs) - 1, 0)
    predicted = correct = 0
    for src, dst in zip(runs[:-1].tolist(), runs[1:].tolist()):
        if src in best:
            predicted += 1
            correct += int(best[src] == dst)
    return {"boundaries": boundaries, "predicted": predicted, "correct": correct, **f1_scores(boundaries, predicted, correct)}


def fleet_next_phase_f1(runs: pd.DataFrame, transitions: Any) -> dict[str, float]:
    """:func:`next_phase_f1` over many containers' runs (``pod_id``, ``run``, ``phase``: gold
    ``phase_sequences`` rows), counts summed before the scores (micro-averaged over the fleet's run ends)."""
    counts = {"boundaries": 0, "predicted": 0, "correct": 0}
    for _, pod in runs.sort_values(["pod_id", "run"]).groupby("pod_id"):
        scores = next_phase_f1(pod["phase"].tolist(), transitions)
        for k in counts:
            counts[k] += int(scores[k])
    return {**counts, **f1_scores(**counts)}


def next_phase_table(transitions: Any) -> dict[int, tuple[int, float]]:
    """``{phase: (most likely next phase, its probability)}`` for every phase with a known successor: what the
    policy model keeps for the live recommendations."""
    successors = normalise_transitions(transitions)
    return {src: nxt for src in sorted(successors) if (nxt := most_likely_next(src, successors)) is not None}


__all__ = ["f1_scores", "fleet_next_phase_f1", "most_likely_next", "next_phase_f1", "next_phase_table", "normalise_transitions"]
