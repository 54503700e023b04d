"""Train a phase model from silver: stratified window sample -> CRBM on the driver -> Spark k-means.

The CRBM sees a bounded sample (``train.sample_size`` windows, at most ``train.max_per_container`` from one
container, so long traces do not dominate); k-means then runs distributed over the encodings of every
training window. Held-out containers (the complement of the window job's hash split) score the result.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ai4dl import __version__, lake
from ai4dl.clustering import adjusted_rand_index, contingency, fit_centers, k_report
from ai4dl.crbm import train_crbm
from ai4dl.labelling import label, stack_rows
from ai4dl.model import PhaseModel, save_version
from ai4dl.schema import POD_ID
from ai4dl.windowing import is_training_container, silver_scaler


def training_windows(silver: DataFrame, cfg: dict[str, Any], train: bool = True) -> DataFrame:
    w = cfg["window"]
    chosen = is_training_container(F.col(POD_ID), w["train_fraction"], w["split_seed"])
    return silver.where(F.col("has_full_history") & (chosen if train else ~chosen))


def stratified_sample(windows: DataFrame, size: int, per_container: int, seed: int) -> DataFrame:
    """At most ``per_container`` random windows of each container, then at most ``size`` overall."""
    order = Window.partitionBy(POD_ID).orderBy(F.rand(seed), "ts")
    capped = windows.withColumn("_r", F.row_number().over(order)).where(F.col("_r") <= per_container).drop("_r")
    return capped.orderBy(F.xxhash64(POD_ID, "ts", F.lit(seed))).limit(size)


def _matrices(df: DataFrame, n_vis: int, n_cond: int) -> tuple[np.ndarray, np.ndarray]:
    pdf = df.select("features", "history").toPandas()
    if pdf.empty:
        raise ValueError("no training windows with full history; ingest and window more data first")
    x = stack_rows(pdf["features"], n_vis)
    cond = stack_rows(pdf["history"], n_cond)
    return x, cond


def train_model(spark: SparkSession, cfg: dict[str, Any], log=print) -> tuple[PhaseModel, dict[str, Any]]:
    """Fit CRBM + k-means on the silver table's training containers; returns the model and a report."""
    t = cfg["train"]
    silver_path = lake.table_path(cfg, "silver")
    silver = lake.read(spark, cfg, "silver")
    scaler, n_history = silver_scaler(spark, silver_path)
    train = training_windows(silver, cfg)
    sample = stratified_sample(train, int(t["sample_size"]), int(t["max_per_container"]), int(t["seed"]))
    x, cond = _matrices(sample, len(scaler.features), len(scaler.features) * n_history)
    log(f"train: CRBM on {len(x)} sampled windows ({len(scaler.features)} features, history {n_history})")
    t0 = time.time()
    if int(t["distributor_processes"]) > 1:
        result = train_distributed(x, cond, _crbm_params(t), int(t["distributor_processes"]), log=log)
    else:
        result = train_crbm(x, cond, **_crbm_params(t), log=log)
    crbm_seconds = time.time() - t0
    # Encode every training window with placeholder centres, then cluster the activations in Spark.
    provisional = PhaseModel(scaler, result.weights, np.zeros((1, result.weights.n_hidden)))
    encoded = label(train, provisional)
    report: dict[str, Any] = {"crbm_windows": len(x), "crbm_epochs": result.epochs_run, "crbm_error": result.best_error, "crbm_seconds": round(crbm_seconds, 2)}
    if t.get("k_range"):
        lo, hi = t["k_range"]
        report["k_report"] = k_report(encoded, range(int(lo), int(hi) + 1), int(t["seed"]))
        for k, sil, inertia in report["k_report"]:
            log(f"train: k={k:2d} silhouette={sil:.3f} inertia={inertia:.1f}")
    centers = fit_centers(encoded, int(t["k"]), int(t["seed"]))
    ts_range = train.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi"), F.countDistinct(POD_ID).alias("n")).first()
    model = PhaseModel(
        scaler,
        result.weights,
        centers,
        info={
            "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "training_data": {
                "silver": silver_path,
                "containers": int(ts_range["n"]),
                "from": str(ts_range["lo"]),
                "to": str(ts_range["hi"]),
                "sampled_windows": len(x),
            },
            "crbm": {"epochs_run": result.epochs_run, "reconstruction_error": result.best_error, "epoch_errors": result.epoch_errors},
            "config": {k: t[k] for k in ("n_hidden", "k", "cd_k", "epochs", "batch_size", "learning_rate", "seed")},
            "versions": _versions(),
        },
    )
    report.update(score_holdout(spark, cfg, model, silver))
    return model, report


def _crbm_params(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "n_hidden": int(t["n_hidden"]), "cd_k": int(t["cd_k"]), "epochs": int(t["epochs"]),
        "batch_size": int(t["batch_size"]), "learning_rate": float(t["learning_rate"]), "patience": int(t["patience"]),
        "min_delta": float(t["min_delta"]), "seed": int(t["seed"]), "device": str(t["device"]),
    }


def _distributed_worker(x: np.ndarray, cond: np.ndarray, params: dict[str, Any]) -> dict[str, Any]:
    """One rank of data-parallel CD: its shard of the sample, parameters averaged after every epoch."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def average(model: Any, epoch_error: float) -> float:
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
                p.data /= world
        err = torch.tensor([epoch_error], dtype=torch.float64)
        dist.all_reduce(err, op=dist.ReduceOp.SUM)
        return float(err.item() / world)

    result = train_crbm(x[rank::world], cond[rank::world], **params, log=None, epoch_sync=average)
    dist.destroy_process_group()
    return {"weights": result.weights.as_dict(), "errors": result.epoch_errors, "stopped": result.stopped_early, "device": result.device}


def train_distributed(x: np.ndarray, cond: np.ndarray, params: dict[str, Any], processes: int, log=print):
    """The CRBM trained with Spark's TorchDistributor (``train.distributor_processes`` > 1): data-parallel
    CD with parameter averaging each epoch, on the driver's cores in local mode, on executors otherwise."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from ai4dl.crbm import CRBMWeights, TrainResult

    t0 = time.time()
    spark = SparkSession.getActiveSession()
    local = spark is None or spark.sparkContext.master.startswith("local")
    out = TorchDistributor(num_processes=processes, local_mode=local, use_gpu=params["device"] == "cuda").run(
        _distributed_worker, x, cond, params
    )
    log(f"train: TorchDistributor, {processes} processes, {len(out['errors'])} epochs, rec_error {min(out['errors']):.6f}")
    return TrainResult(
        weights=CRBMWeights.from_dict(out["weights"]), epoch_errors=out["errors"], epochs_run=len(out["errors"]),
        stopped_early=out["stopped"], seconds=time.time() - t0, device=out["device"],
    )


def score_holdout(spark: SparkSession, cfg: dict[str, Any], model: PhaseModel, silver: DataFrame) -> dict[str, Any]:
    """Adjusted Rand index of the model's phases vs ground truth on held-out containers (if the data has it)."""
    held = training_windows(silver, cfg, train=False).where(F.col("behaviour").isNotNull())
    table, _, _ = contingency(label(held, model))
    if table.size == 0:
        return {}
    return {"holdout_ari": round(adjusted_rand_index(table), 4), "holdout_steps": int(table.sum())}


def refine_model(spark: SparkSession, cfg: dict[str, Any], model: PhaseModel, phase: int, k_sub: int) -> PhaseModel:
    """Split one phase into ``k_sub`` sub-phases by a k-means on that phase's activations only.

    Sub-phase 0 keeps the parent's id, the others get new ids after the highest existing one; every other
    phase keeps its id and its steps (see :func:`ai4dl.labelling.assign`).
    """
    if phase not in range(model.k):
        raise ValueError(f"phase {phase} is not one of the model's top-level phases 0..{model.k - 1}")
    if phase in model.refinements:
        raise ValueError(f"phase {phase} is already refined")
    if k_sub < 2:
        raise ValueError("a refinement needs at least 2 sub-phases")
    silver = lake.read(spark, cfg, "silver")
    encoded = label(training_windows(silver, cfg), model).where(F.col("phase") == phase)
    sub = fit_centers(encoded, k_sub, int(cfg["train"]["seed"]))
    start = max(model.phase_ids) + 1
    ids = (phase, *range(start, start + k_sub - 1))
    refinements = {**model.refinements, phase: (sub, ids)}
    return PhaseModel(model.scaler, model.crbm, model.centers, refinements, {**model.info, "refined": {str(phase): list(ids)}})


def _versions() -> dict[str, str]:
    import pyspark
    import sklearn

    out = {"ai4dl": __version__, "pyspark": pyspark.__version__, "numpy": np.__version__, "scikit-learn": sklearn.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


def run_train(spark: SparkSession, cfg: dict[str, Any], log=print) -> tuple[PhaseModel, str, dict[str, Any]]:
    model, report = train_model(spark, cfg, log)
    path = save_version(model, cfg["lake"]["models"], cfg["train"]["model_name"])
    log(f"train: model {model.model_id} saved to {path}")
    if "holdout_ari" in report:
        log(f"train: adjusted Rand index vs ground truth on held-out containers: {report['holdout_ari']:.3f} ({report['holdout_steps']} steps)")
    return model, str(path), report


__all__ = ["refine_model", "run_train", "score_holdout", "stratified_sample", "train_model"]
