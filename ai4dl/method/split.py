"""The train/held-out split of containers: one object, so every stage agrees on who trained and who is scored.

A container goes to training when a hash of its id (xxhash64 with the split seed, as Spark computes it) falls
below ``train_fraction`` of the hash range: the same containers train on every run, machine and engine, and a
container never has windows on both sides. The scaler is fitted, the CRBM and k-means trained, and the policy
statistics calibrated on the training side only; quality and savings are scored on the held-out side.

>>> from ai4dl.config import WindowConfig
>>> ContainerSplit.of(WindowConfig())
ContainerSplit(train_fraction=0.8, seed=42)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ai4dl.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

    from ai4dl.config import WindowConfig

_BUCKETS = 10_000


@dataclass(frozen=True)
class ContainerSplit:
    """The split's two numbers come from the ``window`` section (:meth:`of`, where their defaults are declared)
    or from a model's record of the split it was trained with; checked here again because a stored record is
    read from a file."""

    train_fraction: float
    seed: int

    def __post_init__(self) -> None:
        if not 0.0 < float(self.train_fraction) <= 1.0:
            raise ConfigError(f"window.train_fraction: {self.train_fraction!r} is not allowed: a number in (0, 1]")

    @classmethod
    def of(cls, window: "WindowConfig") -> "ContainerSplit":
        """The one split every stage uses: ``window.train_fraction`` and ``window.split_seed``."""
        return cls(window.train_fraction, window.split_seed)

    def _bucket(self, pod_id: "Column") -> "Column":
        """The container's place in the hash range: 0 .. _BUCKETS - 1, the same on every run and engine."""
        from pyspark.sql import functions as F

        return F.pmod(F.xxhash64(pod_id, F.lit(int(self.seed))), F.lit(_BUCKETS))

    def is_training(self, pod_id: "Column") -> "Column":
        """A boolean column: this container belongs to the training side."""
        from pyspark.sql import functions as F

        return self._bucket(pod_id) < F.lit(int(round(float(self.train_fraction) * _BUCKETS)))

    def training(self, df: "DataFrame", pod_column: str = "pod_id") -> "DataFrame":
        from pyspark.sql import functions as F

        return df.where(self.is_training(F.col(pod_column)))

    def in_training_sample(self, pod_id: "Column", share: float, from_end: bool = False) -> "Column":
        """A boolean column: the container's hash falls in the first ``share`` of the training range (the last,
        ``from_end``, rounded down: two samples drawn from opposite ends do not meet while their shares sum to
        at most 1, unless one is so small that its one-bucket minimum is all it has)."""
        from pyspark.sql import functions as F

        if not 0.0 < float(share) <= 1.0:
            raise ConfigError(f"training_sample: share {share!r} is not in (0, 1]")
        bucket = self._bucket(pod_id)
        if not from_end:
            return bucket < F.lit(max(1, int(round(float(share) * float(self.train_fraction) * _BUCKETS))))
        end = int(round(float(self.train_fraction) * _BUCKETS))
        cut = max(1, int(float(share) * end))  # round(a) + floor(b) <= end when a + b <= end
        return (bucket >= F.lit(end - cut)) & (bucket < F.lit(end))

    def training_sample(self, df: "DataFrame", share: float, pod_column: str = "pod_id",
                        from_end: bool = False) -> "DataFrame":
        """The training containers whose hash falls in the first (``from_end``: the last) ``share`` of the
        training range: about that share of them, the same ones on every run, and a smaller share gives a subset
        of a larger one's."""
        from pyspark.sql import functions as F

        return df.where(self.in_training_sample(F.col(pod_column), share, from_end))

    def held_out(self, df: "DataFrame", pod_column: str = "pod_id") -> "DataFrame":
        from pyspark.sql import functions as F

        return df.where(~self.is_training(F.col(pod_column)))

    def as_dict(self) -> dict[str, float | int]:
        return {"train_fraction": float(self.train_fraction), "seed": int(self.seed)}
