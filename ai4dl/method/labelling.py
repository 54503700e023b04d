"""Encode windows with a phase model and assign each a phase (its cheapest under the model's costs), inside Spark.

The weights are broadcast once per job; each executor turns an Arrow batch (``arrow_max_records_per_batch``
rows) into two matrices and labels it with one matrix product and one distance computation. Steps without
full history get a null phase, distance and activations: a phase is never guessed from a partial window.

Two interchangeable engines (``label.engine``), both Arrow-backed and batch-at-a-time:

- ``arrow`` (default, ``mapInArrow``): the list columns are read as flat Arrow buffers and reshaped into
  matrices, and the activations go back as one Arrow list array: no Python work per row at all. The
  benchmark measured the pandas conversion of array columns at 3-4x the cost of the maths itself.
- ``pandas`` (``mapInPandas``): the same maths on pandas frames, for environments or readers that prefer
  pandas UDFs; it stacks the per-row arrays of the object columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pandas as pd
from ai4dl.config import DEFAULT_SWITCH_PENALTY
from ai4dl.errors import ConfigError, ModelError
from ai4dl.method.classifier import PhaseClassifier
from ai4dl.method.crbm import CRBMWeights, encode
from ai4dl.method.model import PhaseModel  # the labeller applies a model; the model knows nothing of labelling

if TYPE_CHECKING:  # pragma: no cover - the kernel runs without Spark; the engines need it
    from pyspark.sql import DataFrame


def nearest(centers: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest centre (squared Euclidean, ties to the lowest index, like k-means) and its distance."""
    d2 = _expanded_squares(centers, h)
    idx = np.argmin(d2, axis=1)
    return idx, np.sqrt(np.maximum(d2[np.arange(len(idx)), idx], 0.0))


def _expanded_squares(centers: np.ndarray, h: np.ndarray) -> np.ndarray:
    """|h|^2 - 2 h.c + |c|^2 for every row and centre (may dip a hair below 0 by rounding)."""
    return (h * h).sum(1)[:, None] - 2.0 * h @ centers.T + (centers * centers).sum(1)[None, :]


def squared_distances(centers: np.ndarray, h: np.ndarray) -> np.ndarray:
    """(rows, k) squared Euclidean distances of activations to every centre."""
    return np.maximum(_expanded_squares(centers, np.asarray(h, dtype=np.float64)), 0.0)


def switch_gap(centers: np.ndarray, h: np.ndarray) -> float:
    """The median, over activations, of (second-nearest - nearest) squared distance: the typical margin by
    which a step prefers its phase, the unit of the smoothing's switching penalty (so one penalty setting
    fits models of any hidden size or scale)."""
    if len(centers) < 2 or len(h) == 0:
        return 0.0
    d2 = np.sort(squared_distances(centers, h), axis=1)
    return float(np.median(d2[:, 1] - d2[:, 0]))


def viterbi(costs: np.ndarray, penalty: float) -> np.ndarray:
    """The phase sequence minimising ``sum_t costs[t, s_t] + penalty * (number of phase changes)``: k-means'
    own cost plus a price per switch, so a one-step flicker to a neighbouring phase is not worth a change,
    while a lasting change of behaviour is. Ties keep the current phase, then the lowest phase id.

    >>> c = np.array([[0, 1], [0, 1], [1, 0], [0, 2], [1, 0], [1, 0], [1, 0]], dtype=float)
    >>> viterbi(c, 0.0).tolist(), viterbi(c, 1.5).tolist()
    ([0, 0, 1, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1])
    """
    costs = np.asarray(costs, dtype=np.float64)
    n, k = costs.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    acc = costs[0].copy()
    back = np.zeros((n, k), dtype=np.int64)
    stay = np.arange(k)
    for t in range(1, n):
        best = int(np.argmin(acc))
        switch = acc[best] + penalty
        keep = acc <= switch
        back[t] = np.where(keep, stay, best)
        acc = costs[t] + np.where(keep, acc, switch)
    path = np.empty(n, dtype=np.int64)
    path[-1] = int(np.argmin(acc))
    for t in range(n - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


def forward_decode(costs: np.ndarray, penalty: float, acc: np.ndarray | None = None,
                   current: int | None = None) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The causal counterpart of :func:`viterbi`: at each step, the end of the cheapest path so far under the
    same cost (distances plus ``penalty`` per change), decided with nothing after the step, so a live stream
    can say it the moment the sample arrives. A change is declared once the new phase's evidence has paid for
    the switch, so a one-step flicker is not one. State between calls: the accumulated costs ``acc`` (shifted
    so their minimum is 0: bounded whatever the age) and the ``current`` phase; ties keep ``current``.

    A loop over Python floats, not numpy rows: k is a handful of phases, and per-step numpy calls cost three
    times the arithmetic (measured 7.6 against 2.4 us per step); the numbers are the same IEEE operations.

    >>> c = np.array([[0, 1], [0, 1], [1, 0], [0, 2], [1, 0], [1, 0], [1, 0]], dtype=float)
    >>> forward_decode(c, 0.0)[0].tolist(), forward_decode(c, 1.5)[0].tolist()
    ([0, 0, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1])
    >>> path, acc, cur = forward_decode(c[:4], 1.5)
    >>> forward_decode(c[4:], 1.5, acc, cur)[0].tolist()  # resumed: the same as in one call
    [0, 1, 1]
    """
    costs = np.asarray(costs, dtype=np.float64)
    n, k = costs.shape
    path = np.empty(n, dtype=np.int64)
    a = None if acc is None else [float(v) for v in acc]
    penalty = float(penalty)
    for t, row in enumerate(costs.tolist()):
        if a is None:
            a = row
        else:
            cap = min(a) + penalty
            a = [r + (v if v < cap else cap) for r, v in zip(row, a)]
        low = min(a)
        a = [v - low for v in a]
        best = a.index(0.0)  # the first minimum, as argmin
        if current is not None and a[current] <= 0.0:
            best = int(current)
        current = best
        path[t] = best
    return path, (np.zeros(k) if a is None else np.asarray(a, dtype=np.float64)), current


DECODINGS = ("none", "forward", "viterbi")
"""How a container's phases are read from its steps' costs (:func:`step_costs`: squared distances to the
phase centres, or the model's phase classifier's ``-log p``): ``none`` each step's cheapest phase; ``forward``
:func:`forward_decode` (causal: what the stream says at each step, the default); ``viterbi`` :func:`viterbi`
over the whole trace (offline: needs the steps after)."""
CAUSAL_DECODINGS = ("none", "forward")
DECODING_LATENCY = {"none": "0 steps", "forward": "0 steps", "viterbi": "the whole trace"}
"""How long after a step its phase is final, per decoding: the causal ones decide each step's phase at that
step and never revise it (what the stream serves), Viterbi's waits for the trace to end. The label stage
prints it and records it on the phases table (``ai4dl.decoding_latency``)."""


def decoding_of(model: PhaseModel, configured: str) -> str:
    """The decoding ``model``'s phases get: the one it pins (``info["decoding"]``: the imported original model
    keeps the original tool's per-step labels, a refined model has sub-phases no transition cost prices), else
    ``configured``. A model without a ``switch_gap`` (trained before decoding existed) cannot be decoded."""
    if configured not in DECODINGS:
        raise ConfigError(f"label.smoothing: {configured!r} is not allowed: one of {', '.join(DECODINGS)}")
    pinned = model.info.get("decoding")
    if pinned is not None:
        return str(pinned)
    if configured != "none" and model.refinements:
        raise ConfigError(f"label.smoothing {configured!r} does not apply to a refined model (sub-phases); use 'none'")
    if configured != "none" and model.classifier is None and model.info.get("switch_gap") is None:
        raise ConfigError(f"model {model.model_id} has no switch_gap (trained before decoding existed): retrain it, "
                          "or set label.smoothing none")
    return configured


def default_penalty(model: PhaseModel, decoding: str) -> float:
    """The penalty multiplier of ``decoding`` when none is configured: :data:`DEFAULT_SWITCH_PENALTY` for the
    unit of the model's costs (a classifier's nats and a switch gap of distances price a change differently)."""
    return DEFAULT_SWITCH_PENALTY[decoding]["nats" if model.classifier is not None else "distances"]


def resolve_decoding(model: PhaseModel, configured: str, multiplier: float | None) -> tuple[str, float | None]:
    """:func:`decoding_of` and the penalty multiplier that goes with it: the configured one, else (unset, or the
    model's pinned decoding replaced the configured one) :func:`default_penalty`; None for ``none``."""
    decoding = decoding_of(model, configured)
    if decoding == "none":
        return decoding, None
    return decoding, (float(multiplier) if multiplier is not None and decoding == configured
                      else default_penalty(model, decoding))


def switch_cost(model: PhaseModel, decoding: str, multiplier: float | None = None) -> float:
    """The absolute switching penalty of ``decoding``: ``multiplier`` (default :func:`default_penalty`) x the
    unit of the model's costs: its ``switch_gap`` for squared distances, one nat for a phase classifier's
    ``-log p`` (a penalty of 1 then asks the evidence for a change to be e times likelier than staying); 0 for
    ``none``."""
    if decoding == "none":
        return 0.0
    m = default_penalty(model, decoding) if multiplier is None else float(multiplier)
    return m * (1.0 if model.classifier is not None else float(model.info["switch_gap"]))


def step_costs(centers: np.ndarray, classifier: PhaseClassifier | None, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step (activations ``h``) and phase: the squared distances to the centres (a step's ``distance`` is to
    its phase's centre, whatever chose the phase) and what the decoders minimise, the classifier's ``-log p``
    when the model has one, else those distances. The one definition the label stage, the served model and the
    stream share."""
    d2 = squared_distances(centers, h)
    return d2, (d2 if classifier is None else classifier.costs(h))


def chosen_distances(d2: np.ndarray, path: np.ndarray) -> np.ndarray:
    """Each step's distance to the phase ``path`` gives it, from the steps' squared distances ``d2``."""
    return np.sqrt(d2[np.arange(len(path)), path])


def decode_path(d2: np.ndarray, decoding: str, penalty: float, costs: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """The phases of one container's labelled steps in time order from their ``costs`` (default: their squared
    distances ``d2``; :func:`step_costs`), and each step's distance to the phase it gets."""
    costs = d2 if costs is None else costs
    if decoding == "forward":
        path = forward_decode(costs, penalty)[0]
    elif decoding == "viterbi":
        path = viterbi(costs, penalty)
    else:
        path = np.argmin(costs, axis=1) if len(costs) else np.zeros(0, dtype=np.int64)
    return path, chosen_distances(d2, path)


def decode_table(table: Any, centers: np.ndarray, decoding: str, penalty: float,
                 classifier: PhaseClassifier | None = None) -> Any:
    """One container's phases rows (an Arrow table with ``ts``, ``activations``, ``phase``, ``distance``) sorted
    by ``ts``, their phases decoded by :func:`decode_path` over its labelled steps in time order (segments follow
    each other: an outage is one more step) and ``distance`` the distance to the chosen centre; rows without
    activations (no full window) keep a null phase and distance. The activations become one matrix read from
    the Arrow buffers, never a Python list per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table.take(pc.sort_indices(table, sort_keys=[("ts", "ascending")]))
    acts = table.column("activations").combine_chunks()
    has = acts.is_valid()
    labelled = has.to_numpy(zero_copy_only=False)
    if not labelled.any():
        return table
    d2, costs = step_costs(centers, classifier, _matrix(acts, has, centers.shape[1]))
    path, chosen = decode_path(d2, decoding, penalty, costs)
    phase = np.zeros(len(table), dtype=np.int32)
    dist = np.zeros(len(table), dtype=np.float64)
    phase[labelled], dist[labelled] = path, chosen
    names = table.column_names
    table = table.set_column(names.index("phase"), "phase", pa.array(phase, mask=~labelled))
    return table.set_column(names.index("distance"), "distance", pa.array(dist, mask=~labelled))


def decode_container(pdf: pd.DataFrame, centers: np.ndarray, decoding: str, penalty: float,
                     classifier: PhaseClassifier | None = None) -> pd.DataFrame:
    """:func:`decode_table` on a pandas frame of one container's rows (``phase`` comes back as Int32)."""
    import pyarrow as pa

    out = decode_table(pa.Table.from_pandas(pdf, preserve_index=False), centers, decoding, penalty, classifier)
    return out.to_pandas(types_mapper={pa.int32(): pd.Int32Dtype()}.get)


def assign(
    centers: np.ndarray,
    refinements: dict[int, tuple[np.ndarray, tuple[int, ...]]],
    h: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Phase and distance of each activation row; a refined phase is split by its own sub-centres only,
    so every other phase keeps exactly the steps it had before the refinement."""
    phase, dist = nearest(centers, h)
    for parent, (sub, ids) in refinements.items():
        rows = np.flatnonzero(phase == parent)
        if rows.size:
            j, d = nearest(sub, h[rows])
            phase[rows] = np.asarray(ids)[j]
            dist[rows] = d
    return phase, dist


def label_batch(
    weights: CRBMWeights,
    centers: np.ndarray | None,
    refinements: dict[int, tuple[np.ndarray, tuple[int, ...]]],
    x: np.ndarray,
    cond: np.ndarray,
    classifier: PhaseClassifier | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """The per-batch kernel of both engines: (phase, distance, activations) of full-history windows.

    One matrix product encodes the batch, one distance computation assigns it: each step's nearest centre, or
    with a phase ``classifier`` its cheapest phase under :func:`step_costs` (a refined model has none);
    ``centers=None`` encodes only (training clusters the activations before there are centres).

    One hidden unit, two visible units, one step of history; all weights zero, so every code is sigmoid(0):

    >>> w = CRBMWeights(W=np.zeros((1, 2)), B=np.zeros((1, 2)), A=np.zeros((2, 2)), v_bias=np.zeros(2), h_bias=np.zeros(1))
    >>> phase, dist, h = label_batch(w, np.array([[0.0], [0.4]]), {}, np.ones((3, 2)), np.ones((3, 2)))
    >>> phase.tolist(), np.round(dist, 3).tolist(), h.ravel().tolist()
    ([1, 1, 1], [0.1, 0.1, 0.1], [0.5, 0.5, 0.5])
    """
    h = encode(weights, x, cond)
    if centers is None:
        return None, None, h
    if classifier is not None:
        d2, costs = step_costs(centers, classifier, h)
        phase = np.argmin(costs, axis=1) if len(h) else np.zeros(0, dtype=np.int64)
        return phase, chosen_distances(d2, phase), h
    phase, dist = assign(centers, refinements, h)
    return phase, dist, h


def label_arrays(model: PhaseModel, x: np.ndarray, cond: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, distance, activations) of full-history windows, on the driver: the reference for the engines."""
    phase, dist, h = label_batch(model.crbm, model.centers, model.refinements, x, cond, model.classifier)
    return phase, dist, h  # type: ignore[return-value]


def check_compatible(model: PhaseModel, features: tuple[str, ...], n_history: int, scaler_digest: str | None) -> None:
    """Refuse a model that was not built for this table: its numbers would be silently meaningless."""
    if tuple(features) != tuple(model.features):
        raise ModelError(
            f"model features {list(model.features)} differ from the table's {list(features)}; "
            "rebuild the silver table with this model's scaler (window.scaler_from_model)"
        )
    if int(n_history) != model.n_history:
        raise ModelError(f"model has n_history {model.n_history}, the table was windowed with {n_history}")
    if scaler_digest is not None and scaler_digest != model.scaler.digest:
        raise ModelError(
            "the table was scaled with another scaler than this model's; rebuild silver with "
            "window.scaler_from_model pointing at this model"
        )


def stack_rows(col: pd.Series, width: int) -> np.ndarray:
    """An object column of per-row arrays (as pandas gets list columns from Arrow) as an (n, width) matrix."""
    if len(col) == 0:
        return np.empty((0, width))
    return np.stack(col.to_numpy()).astype(np.float64, copy=False).reshape(len(col), width)


PASSTHROUGH = ["pod_id", "service", "ts", "step", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit", "behaviour"]
ENGINES = ("arrow", "pandas")


def _unpack(payload: dict[str, Any]) -> tuple[CRBMWeights, np.ndarray, dict[int, tuple[np.ndarray, tuple[int, ...]]],
                                              PhaseClassifier | None]:
    a = payload["arrays"]
    weights = CRBMWeights.from_dict({k: a[k] for k in ("W", "B", "A", "v_bias", "h_bias")})
    refinements = {int(k): (a[f"refine_{k}"], tuple(ids)) for k, ids in payload["refine_ids"].items()}
    classifier = PhaseClassifier.from_dict(a) if payload.get("classifier") else None
    return weights, a["centers"], refinements, classifier


def decode(phases: DataFrame, model: PhaseModel, decoding: str, switch_penalty: float | None = None) -> DataFrame:
    """``PHASES`` rows with each container's phases decoded by :func:`decode_table` (``decoding`` as resolved by
    :func:`decoding_of`; ``switch_penalty`` in units of :func:`switch_cost`), one container per task; ``none``
    leaves the rows as labelled (each step's cheapest phase, :func:`label_batch`)."""
    from ai4dl.lake.schema import PHASES

    decoding = decoding_of(model, decoding)
    if decoding == "none":
        return phases
    centers, penalty = np.asarray(model.centers, dtype=np.float64), switch_cost(model, decoding, switch_penalty)
    names, classifier = PHASES.fieldNames(), model.classifier

    def run(table: Any) -> Any:
        return decode_table(table.select(names), centers, decoding, penalty, classifier)

    return phases.groupBy("pod_id").applyInArrow(run, PHASES)


def label_windows(windows: DataFrame, model: PhaseModel, engine: str = "arrow", model_id: str | None = None,
                  decoding: str = "none", switch_penalty: float | None = None) -> DataFrame:
    """Silver windows -> phases rows (schema ``PHASES``), labelled in the executors batch by batch, then with a
    ``decoding`` other than ``none`` each container's phases decoded over its steps in time order
    (:func:`decode`; ``switch_penalty`` in units of :func:`switch_cost`). Lazy, like a fitted ``pyspark.ml`` model's
    ``transform``; :func:`label_arrays` does the same on numpy arrays."""
    assign = decoding_of(model, decoding) == "none"  # else the decoder gives every labelled step its phase
    return decode(label(windows, model, model_id, engine, assign), model, decoding, switch_penalty)


def label(silver: DataFrame, model: PhaseModel, model_id: str | None = None, engine: str = "arrow",
          assign: bool = True) -> DataFrame:
    """Phases rows (schema :data:`ai4dl.schema.PHASES`) for a silver DataFrame. Without ``assign`` the steps
    are encoded only (activations, no phase or distance yet): for a decoder that follows and sets both."""
    from ai4dl.lake.schema import PHASES

    if engine not in ENGINES:
        raise ConfigError(f"label.engine: {engine!r} is not allowed: one of {', '.join(ENGINES)}")
    spark = silver.sparkSession
    payload = {"arrays": model.arrays(), "refine_ids": {p: ids for p, (_, ids) in model.refinements.items()},
               "classifier": model.classifier is not None}
    bc = spark.sparkContext.broadcast(payload)
    n_vis, n_cond = model.crbm.n_visible, model.crbm.n_visible * model.n_history
    mid = model_id or model.model_id
    cols = [*PASSTHROUGH, "features", "history", "has_full_history"]
    names = PHASES.fieldNames()
    if engine == "arrow":
        return silver.select(*cols).mapInArrow(_arrow_labeller(bc, n_vis, n_cond, mid, names, assign), PHASES)

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        weights, centers, refinements, classifier = _unpack(bc.value)
        for pdf in batches:
            full = pdf["has_full_history"].to_numpy(dtype=bool)
            out = pdf[PASSTHROUGH].copy()
            phase = np.full(len(pdf), np.nan)
            dist = np.full(len(pdf), np.nan)
            acts: list[Any] = [None] * len(pdf)
            if full.any():
                x = stack_rows(pdf["features"][full], n_vis)
                cond = stack_rows(pdf["history"][full], n_cond)
                ph, d, h = label_batch(weights, centers if assign else None, refinements, x, cond, classifier)
                if ph is not None:
                    phase[full], dist[full] = ph, d
                idx = np.flatnonzero(full)
                for i, row in zip(idx, h):
                    acts[i] = row
            out["phase"] = pd.array(np.where(full, phase, np.nan), dtype="Int32")
            out["distance"] = dist
            out["activations"] = acts
            out["model_id"] = mid
            yield out[names]

    return silver.select(*cols).mapInPandas(run, PHASES)


def _matrix(column: Any, rows: Any, width: int) -> np.ndarray:
    """Rows ``rows`` (a boolean Arrow mask) of a list<double> column as an (n, width) float64 matrix."""
    import pyarrow.compute as pc

    flat = pc.filter(column, rows).flatten()
    return flat.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).reshape(-1, width)


def _arrow_labeller(bc: Any, n_vis: int, n_cond: int, model_id: str, names: list[str], assign: bool = True):
    """``names``: the PHASES columns in order (mapInArrow matches columns by position); ``assign``: as
    :func:`label`'s."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        weights, centers, refinements, classifier = _unpack(bc.value)
        n_hidden = weights.n_hidden
        out_schema = None
        for batch in batches:
            n = batch.num_rows
            full_col = batch.column("has_full_history")
            full = full_col.to_numpy(zero_copy_only=False).astype(bool)
            phase = np.zeros(n, dtype=np.int32)
            dist = np.zeros(n, dtype=np.float64)
            values = np.zeros((0, n_hidden))
            if full.any():
                x = _matrix(batch.column("features"), full_col, n_vis)
                cond = _matrix(batch.column("history"), full_col, n_cond)
                ph, d, values = label_batch(weights, centers if assign else None, refinements, x, cond, classifier)
                if ph is not None:
                    phase[full], dist[full] = ph, d
            missing = pa.array(~full)
            offsets = np.zeros(n + 1, dtype=np.int32)
            offsets[1:] = np.cumsum(full.astype(np.int32) * n_hidden)
            activations = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.ravel()), mask=missing)
            computed = {
                "phase": pa.array(phase, mask=~full),
                "distance": pa.array(dist, mask=~full),
                "activations": activations,
                "model_id": pa.array(np.full(n, model_id, dtype=object), type=pa.string()),
            }
            columns = [computed[c] if c in computed else batch.column(c) for c in names]
            if out_schema is None:
                out_schema = pa.schema([pa.field(nm, col.type) for nm, col in zip(names, columns)])
            yield pa.RecordBatch.from_arrays(columns, schema=out_schema)

    return run


def encode_windows(windows: DataFrame, crbm: CRBMWeights, n_history: int) -> DataFrame:
    """``pod_id``, ``ts``, ``behaviour`` and the CRBM ``activations`` of full-history windows (for k-means).

    The same Arrow path and kernel as :func:`label`, without centres: training encodes its windows before it
    has any.
    """
    import pyspark.sql.types as T

    spark = windows.sparkSession
    bc = spark.sparkContext.broadcast({"arrays": crbm.as_dict()})
    n_vis, n_cond = crbm.n_visible, crbm.n_visible * n_history
    schema = T.StructType([
        T.StructField("pod_id", T.StringType(), False),
        T.StructField("ts", T.TimestampType(), False),
        T.StructField("behaviour", T.StringType(), True),
        T.StructField("activations", T.ArrayType(T.DoubleType(), False), False),
    ])

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        a = bc.value["arrays"]
        weights = CRBMWeights.from_dict({k: a[k] for k in ("W", "B", "A", "v_bias", "h_bias")})
        for batch in batches:
            full_col = batch.column("has_full_history")
            full = full_col.to_numpy(zero_copy_only=False).astype(bool)
            _, _, h = label_batch(weights, None, {}, _matrix(batch.column("features"), full_col, n_vis),
                                  _matrix(batch.column("history"), full_col, n_cond))
            offsets = np.arange(len(h) + 1, dtype=np.int32) * weights.n_hidden
            acts = pa.ListArray.from_arrays(pa.array(offsets), pa.array(h.ravel()))
            mask = pa.array(full)
            cols = [batch.column(c).filter(mask) for c in ("pod_id", "ts", "behaviour")]
            yield pa.RecordBatch.from_arrays([*cols, acts], names=schema.fieldNames())

    cols = ["pod_id", "ts", "behaviour", "features", "history", "has_full_history"]
    return windows.where("has_full_history").select(*cols).mapInArrow(run, schema)


__all__ = [
    "CAUSAL_DECODINGS", "DECODINGS", "DECODING_LATENCY", "assign", "check_compatible", "chosen_distances", "decode", "decode_container",
    "decode_path", "decode_table", "decoding_of", "default_penalty", "encode_windows", "resolve_decoding", "forward_decode", "label", "label_arrays", "label_batch",
    "label_windows", "nearest", "step_costs",
    "switch_cost", "viterbi",
]
