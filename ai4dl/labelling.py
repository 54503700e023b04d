"""Encode windows with a phase model and assign each to its nearest phase, inside Spark.

The weights are broadcast once per job; each executor turns an Arrow batch (``arrow_max_records_per_batch``
rows) into two matrices and labels it with one matrix product and one distance computation: no per-row
Python work beyond unpacking the array columns. Steps without full history get a null phase, distance and
activations: a phase is never guessed from a partial window.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from ai4dl import lake
from ai4dl.crbm import CRBMWeights, encode
from ai4dl.model import ModelError, PhaseModel
from ai4dl.schema import PHASES, PHASES_PARTITIONS


def nearest(centers: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest centre (squared Euclidean, ties to the lowest index, like k-means) and its distance."""
    d2 = (h * h).sum(1)[:, None] - 2.0 * h @ centers.T + (centers * centers).sum(1)[None, :]
    idx = np.argmin(d2, axis=1)
    return idx, np.sqrt(np.maximum(d2[np.arange(len(idx)), idx], 0.0))


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


def label_arrays(model: PhaseModel, x: np.ndarray, cond: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, distance, activations) of full-history windows, on the driver: the reference for the UDF."""
    h = encode(model.crbm, x, cond)
    phase, dist = assign(model.centers, model.refinements, h)
    return phase, dist, h


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


def _stack(col: pd.Series, width: int) -> np.ndarray:
    if len(col) == 0:
        return np.empty((0, width))
    return np.stack(col.to_numpy()).astype(np.float64, copy=False).reshape(len(col), width)


def label(silver: DataFrame, model: PhaseModel, model_id: str | None = None) -> DataFrame:
    """Phases rows (schema :data:`ai4dl.schema.PHASES`) for a silver DataFrame."""
    spark = silver.sparkSession
    payload = {"arrays": model.arrays(), "refine_ids": {p: ids for p, (_, ids) in model.refinements.items()}}
    bc = spark.sparkContext.broadcast(payload)
    n_vis, n_cond = model.crbm.n_visible, model.crbm.n_visible * model.n_history
    mid = model_id or model.model_id
    passthrough = ["pod_id", "service", "ts", "step", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit", "behaviour"]

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        p = bc.value
        a = p["arrays"]
        weights = CRBMWeights.from_dict({k: a[k] for k in ("W", "B", "A", "v_bias", "h_bias")})
        refinements = {int(k): (a[f"refine_{k}"], tuple(ids)) for k, ids in p["refine_ids"].items()}
        for pdf in batches:
            full = pdf["has_full_history"].to_numpy(dtype=bool)
            out = pdf[passthrough].copy()
            phase = np.full(len(pdf), np.nan)
            dist = np.full(len(pdf), np.nan)
            acts: list[Any] = [None] * len(pdf)
            if full.any():
                x = _stack(pdf["features"][full], n_vis)
                cond = _stack(pdf["history"][full], n_cond)
                h = encode(weights, x, cond)
                ph, d = assign(a["centers"], refinements, h)
                phase[full], dist[full] = ph, d
                idx = np.flatnonzero(full)
                for i, row in zip(idx, h):
                    acts[i] = row
            out["phase"] = pd.array(np.where(full, phase, np.nan), dtype="Int32")
            out["distance"] = dist
            out["activations"] = acts
            out["model_id"] = mid
            yield out[PHASES.fieldNames()]

    cols = [*passthrough, "features", "history", "has_full_history"]
    return silver.select(*cols).mapInPandas(run, PHASES)


def run_label(spark: SparkSession, cfg: dict[str, Any], model: PhaseModel, model_id: str | None = None) -> dict[str, int]:
    """Silver -> phases table (replaced atomically), after checking the model fits the silver table."""
    from ai4dl.windowing import silver_scaler

    silver_path = lake.table_path(cfg, "silver")
    silver = lake.read(spark, cfg, "silver")
    scaler, n_history = silver_scaler(spark, silver_path)
    check_compatible(model, scaler.features, n_history, scaler.digest)
    phases = label(silver, model, model_id)
    path = lake.table_path(cfg, "phases")
    lake.overwrite(phases, path, PHASES, partition_by=PHASES_PARTITIONS, properties={"ai4dl.model_id": model_id or model.model_id})
    counts = spark.read.format("delta").load(path).groupBy("phase").count().orderBy("phase").collect()
    total = sum(r["count"] for r in counts)
    shown = ", ".join(f"{'none' if r['phase'] is None else r['phase']}: {r['count']}" for r in counts)
    print(f"phases: {total} steps labelled ({shown}) -> {path}")
    return {"phases": total}


__all__ = ["assign", "check_compatible", "label", "label_arrays", "nearest", "run_label"]
