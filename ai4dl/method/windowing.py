"""Sliding windows: each container step with its ``n_history`` previous steps, scaled, as one silver row.

Ordering and irregular sampling, deterministically:
- steps of a container are ordered by ``ts`` (arrival order does not matter; bronze holds one row per
  ``(pod_id, ts)``), ``step`` is the 0-based position in that order;
- the history of a step is the ``n_history`` samples before it, however far apart (this is what the original
  AI4DL tool did); with ``max_gap_seconds`` set, a longer gap starts a new ``segment`` and the history
  restarts there, so a window never spans an outage;
- steps with fewer than ``n_history`` predecessors in their segment are kept with ``has_full_history`` false and
  a null ``history``: they get a null phase later, never a fake one; so do windows with a feature that is not a
  finite number (a derived share of a zero or unknown limit), whose encoding would be meaningless.

One kernel, :func:`container_windows`, builds the windows of one container's ordered samples (numpy): the window
stage runs it per container in Spark (:func:`build_windows`, ``applyInArrow``), the served model
(:mod:`ai4dl.method.serving`) on a request's containers, and the stream (:mod:`ai4dl.stream.online`) on the
samples a container's state keeps plus a micro-batch's new ones. Three callers, one definition of a segment, a
derived feature, a scaled value and a full window, so their phases cannot drift apart.

>>> import numpy as np
>>> segments(np.array([0.0, 30.0, 60.0, 500.0, 530.0]), max_gap_seconds=120).tolist()
[0, 0, 0, 1, 1]
>>> w = stack_windows(np.arange(10.0).reshape(5, 2), np.array([0, 0, 0, 1, 1]), n_history=2)
>>> w.full.tolist()  # two predecessors in the same segment
[False, False, True, False, False]
>>> w.history[2].tolist()  # steps 0 and 1, oldest first, time-major
[0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from ai4dl.errors import InputError, MissingTableError
from ai4dl.lake.schema import BEHAVIOUR, METRICS, POD_ID, SERVICE, TS
from ai4dl.method.features import INPUTS, derive_segments, derived_of
from ai4dl.method.scaler import Scaler

if TYPE_CHECKING:  # pragma: no cover - the kernel runs without Spark (served model, stream)
    from pyspark.sql import DataFrame

PROP_SCALER = "ai4dl.scaler"
PROP_HISTORY = "ai4dl.n_history"
PROP_FEATURES = "ai4dl.features"


# The bronze columns windows are built from: the key, the metrics (features, derived features' inputs, raw
# demand) and the ground truth. Bronze's bookkeeping (source file, ingest time, event date) is left in the scan:
# the windows are built in Python per container, and what is read is shipped there and back.
WINDOW_INPUTS: tuple[str, ...] = (POD_ID, SERVICE, TS, *METRICS, BEHAVIOUR)


def window_inputs(bronze: "DataFrame") -> "DataFrame":
    """Bronze narrowed to :data:`WINDOW_INPUTS` (those it has)."""
    return bronze.select(*[c for c in WINDOW_INPUTS if c in bronze.columns])


def segments(seconds: np.ndarray, max_gap_seconds: float | None) -> np.ndarray:
    """The 0-based segment of each of a container's samples (``seconds``: epoch seconds in time order): a gap
    longer than ``max_gap_seconds`` starts the next one; without it, one segment."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if not max_gap_seconds or len(seconds) < 2:
        return np.zeros(len(seconds), dtype=np.int32)
    return np.r_[0, np.cumsum(np.diff(seconds) > float(max_gap_seconds))].astype(np.int32)


@dataclass(frozen=True)
class Windows:
    """The windows of one container's samples in time order (one row per sample)."""

    segment: np.ndarray  # int32: the sample's segment
    features: np.ndarray  # (samples, features): scaled; NaN where unknown
    history: np.ndarray  # (samples, n_history * features): the previous samples' features, oldest first; NaN rows without them
    has_history: np.ndarray  # bool: n_history predecessors in the sample's segment
    full: np.ndarray  # bool: has_history, and every value of the window a finite number (the ones labelled)


def stack_windows(x: np.ndarray, segment: np.ndarray, n_history: int) -> Windows:
    """Windows over scaled features ``x`` (samples in time order) of the given segments."""
    if n_history < 1:
        raise InputError(f"n_history must be at least 1, got {n_history}")
    x = np.asarray(x, dtype=np.float64)
    n, f = x.shape
    idx = np.arange(n)
    first = np.r_[True, segment[1:] != segment[:-1]][:n]  # a segment's first sample
    position = idx - np.maximum.accumulate(np.where(first, idx, 0))  # within the segment
    has_history = position >= n_history
    padded = np.vstack([np.full((n_history, f), np.nan), x])
    history = np.concatenate([padded[n_history - k : n_history - k + n] for k in range(n_history, 0, -1)], axis=1)
    history[~has_history] = np.nan
    finite = np.isfinite(padded).all(axis=1)
    full = has_history & np.logical_and.reduce([finite[n_history - k : n_history - k + n] for k in range(n_history + 1)])
    return Windows(np.asarray(segment, dtype=np.int32), x, history, has_history, full)


def container_windows(frame: pd.DataFrame, seconds: np.ndarray, scaler: Scaler, n_history: int,
                      max_gap_seconds: float | None = None) -> Windows:
    """The windows of one container: ``frame`` holds its samples in time order (the scaler's features, or the
    derived features' inputs, :data:`ai4dl.method.features.INPUTS`), ``seconds`` their epoch seconds. Derived
    features are computed per segment, then every feature is scaled with ``scaler``."""
    segment = segments(seconds, max_gap_seconds)
    frame = derive_segments(frame, scaler.features, segment)
    x = scaler.transform(frame[list(scaler.features)].to_numpy(dtype=np.float64))
    return stack_windows(x, segment, n_history)


def _needed(features: Sequence[str]) -> list[str]:
    """The columns a container's samples need for ``features``: the plain ones, and the derived ones' inputs."""
    derived = derived_of(features)
    return list(dict.fromkeys([*(f for f in features if f not in derived), *(INPUTS if derived else ())]))


def _ordered(table: Any, columns: Sequence[str]) -> tuple[Any, pd.DataFrame, np.ndarray]:
    """One container's Arrow rows sorted by ``ts``, the ``columns`` as float pandas columns (nulls NaN) and the
    rows' epoch seconds (as Spark's ``cast(ts as double)``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table.take(pc.sort_indices(table, sort_keys=[(TS, "ascending")]))
    pdf = pd.DataFrame({c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in columns})
    micros = table.column(TS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    return table, pdf, micros.astype(np.int64) / 1e6


def _check_columns(df: "DataFrame", features: Sequence[str]) -> None:
    derived = derived_of(features)
    plain = [f for f in features if f not in derived and f not in df.columns]
    if plain:
        raise InputError(f"bronze lacks the scaler's feature column(s): {', '.join(plain)}")
    inputs = [c for c in INPUTS if c not in df.columns] if derived else []
    if inputs:
        raise InputError(f"derived features {list(derived)} need column(s) {inputs}")


def with_derived(df: "DataFrame", features: Sequence[str], max_gap_seconds: float | None = None) -> "DataFrame":
    """A Spark DataFrame of trace rows (``pod_id``, ``ts``, the metrics) with the derived ``features`` added,
    computed per container and segment in time order as :func:`container_windows` computes them (``df``
    unchanged without any): what the scaler is fitted on."""
    wanted = derived_of(features)
    if not wanted:
        return df
    from pyspark.sql.types import DoubleType, StructField, StructType

    _check_columns(df, wanted)
    schema = StructType([*df.schema.fields, *(StructField(n, DoubleType(), True) for n in wanted)])

    def per_container(table: Any) -> Any:
        import pyarrow as pa

        table, pdf, secs = _ordered(table, INPUTS)
        out = derive_segments(pdf, wanted, segments(secs, max_gap_seconds))
        for name in wanted:  # NaN (a share of an unknown limit) becomes null
            table = table.append_column(name, pa.array(out[name].to_numpy(dtype=np.float64), type=pa.float64(), from_pandas=True))
        return table

    return df.groupBy(POD_ID).applyInArrow(per_container, schema)


def fit_scaler(training: "DataFrame", features: Sequence[str], max_gap_seconds: float | None = None) -> Scaler:
    """The scaler of ``features`` fitted on the training containers' rows (``training``: their bronze rows),
    derived features computed per container for them alone and only the columns the features need shipped."""
    _check_columns(training, features)
    narrow = training.select(POD_ID, TS, *_needed(features))
    return Scaler.fit(with_derived(narrow, features, max_gap_seconds), features)


def build_windows(bronze: "DataFrame", scaler: Scaler, n_history: int, max_gap_seconds: float | None = None) -> "DataFrame":
    """Silver rows (schema :data:`ai4dl.lake.schema.SILVER`) from bronze rows: :func:`container_windows` per
    container, in the executors (one shuffle by ``pod_id``; nothing is collected to the driver)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from ai4dl.lake.schema import SILVER

    if n_history < 1:
        raise InputError(f"n_history must be at least 1, got {n_history}")
    _check_columns(bronze, scaler.features)
    columns = _needed(scaler.features)
    arrow_schema = to_arrow_schema(SILVER)
    inputs = window_inputs(bronze)
    if BEHAVIOUR not in inputs.columns:
        from pyspark.sql import functions as F

        inputs = inputs.withColumn(BEHAVIOUR, F.lit(None).cast("string"))

    def per_container(table: Any) -> Any:
        import pyarrow as pa

        table, pdf, secs = _ordered(table, columns)
        w = container_windows(pdf, secs, scaler, n_history, max_gap_seconds)
        n, f = w.features.shape
        built = {
            "step": pa.array(np.arange(n, dtype=np.int32)),
            "segment": pa.array(w.segment),
            "features": _lists(w.features, f),
            "history": _lists(w.history, f * n_history, valid=w.has_history),
            "has_full_history": pa.array(w.full),
        }
        # the key, the raw demand and the ground truth pass through from bronze as they are
        arrays = [built[name] if name in built else table.column(name).cast(arrow_schema.field(name).type)
                  for name in arrow_schema.names]
        return pa.Table.from_arrays(arrays, schema=arrow_schema)

    return inputs.groupBy(POD_ID).applyInArrow(per_container, SILVER)


def _lists(values: np.ndarray, width: int, valid: np.ndarray | None = None) -> Any:
    """An Arrow list<double> column of ``width`` values per row (NaN -> null), null where not ``valid``."""
    import pyarrow as pa

    offsets = pa.array(np.arange(len(values) + 1, dtype=np.int32) * np.int32(width))
    flat = pa.array(values.ravel(), type=pa.float64(), from_pandas=True)
    mask = None if valid is None else pa.array(~np.asarray(valid, dtype=bool))
    return pa.ListArray.from_arrays(offsets, flat, mask=mask)


def silver_properties(scaler: Scaler, n_history: int) -> dict[str, str]:
    """The table properties that travel with silver's data: a model is checked against them before labelling."""
    return {
        PROP_SCALER: scaler.to_json().replace("\n", ""),
        PROP_HISTORY: str(int(n_history)),
        PROP_FEATURES: ",".join(scaler.features),
    }


def silver_scaler(props: dict[str, str], where: str = "silver") -> tuple[Scaler, int]:
    """The scaler and history length a silver table was built with (from its table properties)."""
    if PROP_SCALER not in props or PROP_HISTORY not in props:
        raise MissingTableError(f"{where} carries no scaler/history properties; rebuild it with the window stage")
    return Scaler.from_json(props[PROP_SCALER]), int(props[PROP_HISTORY])


__all__ = ["Windows", "build_windows", "container_windows", "fit_scaler", "segments", "silver_properties", "silver_scaler",
           "stack_windows", "with_derived"]
