"""Feature standardisation fitted on the training fleet, stored as plain JSON beside the model.

Mean and scale are population statistics (like scikit-learn's StandardScaler, which the original AI4DL tool
used), computed in one distributed aggregation; a constant feature gets scale 1 so it maps to 0, not NaN.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ai4dl.errors import InputError

if TYPE_CHECKING:  # pragma: no cover - Spark is needed to fit and apply in Spark, not to load or transform
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Scaler:
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.features) == len(self.mean) == len(self.scale)):
            raise ValueError(
                f"scaler has {len(self.features)} features but {len(self.mean)} means and {len(self.scale)} scales"
            )
        bad = [f for f, m, s in zip(self.features, self.mean, self.scale) if not (math.isfinite(m) and math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"scaler statistics are not finite and positive for: {', '.join(bad)}")

    @classmethod
    def fit(cls, df: "DataFrame", features: Sequence[str]) -> "Scaler":
        from pyspark.sql import functions as F

        aggs = []
        for f in features:
            aggs += [F.avg(F.col(f)).alias(f"m_{f}"), F.stddev_pop(F.col(f)).alias(f"s_{f}")]
        row = df.agg(*aggs).first()
        if row is None or row[f"m_{features[0]}"] is None:
            raise InputError("cannot fit a scaler on an empty training selection (no training container in bronze)")
        means = tuple(float(row[f"m_{f}"]) for f in features)
        scales = tuple(float(row[f"s_{f}"]) if row[f"s_{f}"] else 1.0 for f in features)
        return cls(tuple(features), means, scales)

    def columns(self) -> "list[Column]":
        """Scaled feature columns, in feature order."""
        from pyspark.sql import functions as F

        return [((F.col(f) - F.lit(m)) / F.lit(s)) for f, m, s in zip(self.features, self.mean, self.scale)]

    def transform(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - np.asarray(self.mean)) / np.asarray(self.scale)

    def to_json(self) -> str:
        return json.dumps({"features": list(self.features), "mean": list(self.mean), "scale": list(self.scale)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Scaler":
        d = json.loads(text)
        try:
            return cls(tuple(d["features"]), tuple(float(v) for v in d["mean"]), tuple(float(v) for v in d["scale"]))
        except KeyError as exc:
            raise ValueError(f"scaler JSON lacks key {exc}") from None

    @property
    def digest(self) -> str:
        """Identifies the scaling a silver table was built with, so a model using another one is refused."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
