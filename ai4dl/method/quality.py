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


__all__ = ["phase_quality"]
