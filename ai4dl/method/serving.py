"""Phases of raw traces in a pandas frame, without Spark: what a served model (MLflow pyfunc) answers.

A request carries raw samples (the export's columns, several containers, any row order), not silver windows.
The batch path's kernels are called on them, so the phases are the ones the ``label`` stage writes: each
container's samples ordered by time and windowed by the window stage's kernel
(:func:`ai4dl.method.windowing.container_windows`: segments, derived features, scaling with the model's scaler),
labelled by the label stage's (:func:`ai4dl.method.labelling.label_batch`) and decoded as it decodes them.
Steps without full history get no phase, never a guess.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ai4dl.errors import InputError
from ai4dl.method.features import INPUTS, derived_of
from ai4dl.lake.columns import POD_ID, SOURCE_COLUMNS, TS
from ai4dl.method.labelling import decode_path, label_batch, resolve_decoding, step_costs, switch_cost
from ai4dl.method.model import PhaseModel
from ai4dl.method.windowing import container_windows

MILLIS_THRESHOLD = 1e11  # as ingest: a number this large is epoch milliseconds


def epoch_seconds(values: pd.Series) -> np.ndarray:
    """Timestamps as float epoch seconds: numbers (seconds, or milliseconds from 1e11 on, as ingest reads
    them), datetimes, or ISO strings (UTC unless they carry an offset).

    >>> epoch_seconds(pd.Series([1565962220, 1565962220000])).tolist()
    [1565962220.0, 1565962220.0]
    >>> epoch_seconds(pd.Series(["2019-08-16T13:30:20Z"])).tolist()
    [1565962220.0]
    """
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all():
        x = numbers.to_numpy(dtype=np.float64)
        return np.where(np.abs(x) >= MILLIS_THRESHOLD, x / 1000.0, x)
    parsed = pd.to_datetime(values, utc=True, errors="coerce")
    if parsed.isna().any():
        bad = values[parsed.isna()].iloc[0]
        raise InputError(f"timestamp {bad!r} is not epoch seconds, milliseconds or an ISO-8601 time")
    return (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()


def label_traces(model: PhaseModel, traces: pd.DataFrame, max_gap_seconds: float | None = None,
                 decoding: str = "none", switch_penalty: float | None = None) -> pd.DataFrame:
    """``pod_id``, ``ts`` (epoch seconds), ``step``, ``phase`` (nullable Int32) and ``distance`` of every row of
    ``traces``, in the input's row order (the input's index is kept); each container's phases decoded as the
    label stage decodes them (``decoding``, ``switch_penalty``: :func:`ai4dl.method.labelling.decode`).

    ``traces`` has the export's columns (``pod.id``, ``timestamp``, ``cpu.usage``...) or the lake's
    (``pod_id``, ``ts``, ``cpu_usage``...). A container's rows must be unique per timestamp, as in bronze.
    """
    frame = traces.rename(columns={c: SOURCE_COLUMNS[c] for c in traces.columns if c in SOURCE_COLUMNS})
    derived = derived_of(model.features)
    needed = [f for f in model.features if f not in derived] + (list(INPUTS) if derived else [])
    missing = [c for c in (POD_ID, TS, *dict.fromkeys(needed)) if c not in frame.columns]
    if missing:
        raise InputError(f"traces lack column(s) {', '.join(missing)} (the export's or the lake's names)")
    pods = frame[POD_ID].astype(str).to_numpy()
    ts = epoch_seconds(frame[TS])
    # Row positions ordered by container, then time (a stable sort keeps the input order of equal keys).
    order = np.lexsort((ts, pods))
    starts = np.r_[0, np.flatnonzero(pods[order][1:] != pods[order][:-1]) + 1] if len(order) else np.zeros(0, int)
    step = np.zeros(len(frame), dtype=np.int64)
    labelled: list[np.ndarray] = []  # per container, the row positions of its full windows, in time order
    xs: list[np.ndarray] = []
    conds: list[np.ndarray] = []
    try:
        values = frame[list(dict.fromkeys(needed))].astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"traces: a feature column is not numeric ({exc})") from None
    for rows in np.split(order, starts[1:]) if len(order) else []:  # each container's row positions, in time order
        step[rows] = np.arange(len(rows))
        part = values.iloc[rows].reset_index(drop=True)
        w = container_windows(part, ts[rows], model.scaler, model.n_history, max_gap_seconds)
        labelled.append(rows[w.full])
        xs.append(w.features[w.full])
        conds.append(w.history[w.full])
    phase = pd.array([pd.NA] * len(frame), dtype="Int32")
    distance = np.full(len(frame), np.nan)
    if sum(len(r) for r in labelled):
        x, cond = np.concatenate(xs), np.concatenate(conds)
        decoding, multiplier = resolve_decoding(model, decoding, switch_penalty)
        if decoding == "none":
            ph, dist, h = label_batch(model.crbm, model.centers, model.refinements, x, cond, model.classifier)
        else:  # encoded, then each container's run of the batch decoded in time order
            h = label_batch(model.crbm, None, {}, x, cond)[2]
            ph, dist = np.zeros(len(h), dtype=np.int64), np.zeros(len(h))
            d2, costs = step_costs(np.asarray(model.centers, dtype=np.float64), model.classifier, h)
            penalty = switch_cost(model, decoding, multiplier)
            bounds = np.cumsum([0, *(len(r) for r in labelled)])
            for a, b in zip(bounds[:-1], bounds[1:]):
                if b > a:
                    ph[a:b], dist[a:b] = decode_path(d2[a:b], decoding, penalty, costs[a:b])
        target = np.concatenate(labelled)
        phase[target] = ph.astype(np.int32)
        distance[target] = dist
    return pd.DataFrame(
        {POD_ID: pods, TS: ts, "step": step, "phase": phase, "distance": distance}, index=traces.index
    )


__all__ = ["epoch_seconds", "label_traces"]
