"""How well phases recover known behaviours (generated fleets carry a ground-truth ``behaviour`` per step).

Pure pandas/scikit-learn, so the scoring of ``bench/phase_quality.py`` is tested on hand-made labels.

>>> s = phase_quality(["a", "a", "b", "b"], [1, 1, 0, 0])
>>> round(s["ari"], 3), round(s["nmi"], 3), s["behaviours"]["a"]
(1.0, 1.0, {'steps': 2, 'phase': 1, 'purity': 1.0})
"""

from __future__ import annotations

from typing import Any, Sequence


def phase_quality(truth: Sequence[Any], predicted: Sequence[Any]) -> dict[str, Any]:
    """Adjusted Rand index, normalised mutual information, and per behaviour its purity (the share of its steps
    in its most common phase) and that phase. Steps where either label is missing are left out."""
    import pandas as pd
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    df = pd.DataFrame({"truth": list(truth), "phase": list(predicted)}).dropna()
    per = {}
    for behaviour, part in df.groupby("truth"):
        counts = part["phase"].value_counts(sort=True)
        top = counts[counts == counts.iloc[0]].index.min()  # ties: the smallest phase id
        per[str(behaviour)] = {"steps": int(len(part)), "phase": int(top), "purity": float(counts.iloc[0] / len(part))}
    return {
        "ari": float(adjusted_rand_score(df["truth"], df["phase"])) if len(df) else float("nan"),
        "nmi": float(normalized_mutual_info_score(df["truth"], df["phase"])) if len(df) else float("nan"),
        "steps": int(len(df)),
        "behaviours": per,
    }


def change_timing(truth: Sequence[Any], predicted: Sequence[Any]) -> dict[str, Any]:
    """When one container's phases change, against when its true behaviour does (both per step, in time order):
    for each true change, the delay in steps to the first phase change at or after it and before the next true
    change (none there: ``missed``); every other phase change is a false one. What a policy triggered by a
    phase change pays: late reactions, and reactions to nothing. ``per_change`` has each true change's delay in
    order, None where missed (which kinds of change are seen late).

    >>> t = change_timing(list("aaaabbbbbbcccc"), [0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 2, 2])
    >>> t["delays"], t["missed"], t["false_changes"], t["steps"], t["per_change"]
    ([1, 2], 0, 2, 14, [1, 2])
    """
    delays: list[int] = []
    per_change: list[int | None] = []
    missed = false = 0
    n = len(truth)
    true_at = [i for i in range(1, n) if truth[i] != truth[i - 1]]
    seen_at = [i for i in range(1, n) if predicted[i] != predicted[i - 1]]
    bounds = [*true_at, n]
    matched = set()
    for j, t in enumerate(true_at):
        hit = next((s for s in seen_at if t <= s < bounds[j + 1]), None)
        if hit is None:
            missed += 1
        else:
            delays.append(hit - t)
            matched.add(hit)
        per_change.append(None if hit is None else hit - t)
    false = sum(1 for s in seen_at if s not in matched)
    return {"delays": delays, "missed": missed, "false_changes": false, "steps": n, "per_change": per_change}


def fleet_change_timing(per_container: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """:func:`change_timing` of many containers summed: delay p50 and p95 in steps, the share of true changes
    never followed by a phase change in their behaviour, and false phase changes per 1,000 steps."""
    import numpy as np

    delays = [d for c in per_container for d in c["delays"]]
    true_changes = len(delays) + sum(c["missed"] for c in per_container)
    steps = sum(c["steps"] for c in per_container)
    false = sum(c["false_changes"] for c in per_container)
    return {
        "true_changes": true_changes,
        "delay_p50": float(np.percentile(delays, 50)) if delays else float("nan"),
        "delay_p95": float(np.percentile(delays, 95)) if delays else float("nan"),
        "missed_share": (true_changes - len(delays)) / true_changes if true_changes else float("nan"),
        "false_per_1000_steps": 1000.0 * false / steps if steps else float("nan"),
    }


__all__ = ["change_timing", "fleet_change_timing", "phase_quality"]
