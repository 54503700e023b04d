"""Phases as k-means clusters of hidden activations: fitted on the CRBM's training sample, in the driver
(scikit-learn, the default) or with Spark ML (``train.kmeans_engine``), and assigned to every window in the
executors by ``label``.

Spark ML: k-means|| initialisation, seeded; the centres come back to the driver (k x n_hidden numbers) and go into the
model. The adjusted Rand index, computed from a Spark contingency table of (phase, ground truth) counts, scores
discovered phases against the generator's behaviours without bringing rows to the driver.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from math import comb
from typing import Iterable

import numpy as np
from pyspark.ml.clustering import KMeans
from pyspark.ml.evaluation import ClusteringEvaluator
from pyspark.ml.functions import array_to_vector
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ai4dl.errors import InputError

# k-means starts fitted at once (threads submitting Spark jobs): enough to keep 2-8 cores busy between jobs.
_PARALLEL_STARTS = 4


def _vectors(df: DataFrame, column: str = "activations") -> DataFrame:
    return df.where(F.col(column).isNotNull()).select(array_to_vector(F.col(column)).alias("v"))


def fit_centers(df: DataFrame, k: int, seed: int, column: str = "activations", max_iter: int = 50,
                restarts: int = 1) -> np.ndarray:
    """k-means centres (k, dim) of an array column; fewer distinct points than k is an error, not k duplicates.

    ``restarts`` > 1 fits with seeds ``seed, seed + 1, ...`` and keeps the fit of the lowest training cost:
    one start often merges two behaviours and splits another, so which phases a model finds would depend on
    the seed; the best of several does not (measured on the frozen fleet, README "Method notes")."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, got {restarts}")
    vectors = _vectors(df, column).cache()
    try:
        n = vectors.count()
        if n == 0:
            raise InputError("no activations to cluster (no window has full history?)")
        distinct = vectors.select(F.col("v").cast("string")).distinct().limit(k).count()
        if distinct < k:
            raise InputError(f"k={k} phases requested but the activations have only {distinct} distinct points")
        def fit(attempt: int) -> tuple[float, list]:
            model = KMeans(k=k, seed=seed + attempt, featuresCol="v", initMode="k-means||", maxIter=max_iter).fit(vectors)
            return float(model.summary.trainingCost), model.clusterCenters()

        # The starts run side by side: each is some 60 Spark jobs of a few milliseconds of work, so one start at
        # a time leaves the cores waiting on job scheduling. Same seeds, same data, same partitions: the same
        # fits as one after the other, and the lowest cost wins with ties to the earlier seed, as before.
        with ThreadPoolExecutor(max_workers=min(int(restarts), _PARALLEL_STARTS)) as pool:
            fits = list(pool.map(fit, range(int(restarts))))
        best = min(range(len(fits)), key=lambda i: (fits[i][0], i))
        centers = np.array([np.asarray(c, dtype=np.float64) for c in fits[best][1]])
    finally:
        vectors.unpersist()
    # Stable phase ids: order centres by their first coordinate then the rest, not by Spark's internal order.
    order = np.lexsort(centers.T[::-1])
    return centers[order]


def fit_centers_local(points: np.ndarray, k: int, seed: int, restarts: int = 1, max_iter: int = 300) -> np.ndarray:
    """:func:`fit_centers` on activations already in the driver (the CRBM's training sample), with scikit-learn.

    k-means++ starts seeded by ``seed``, ``restarts`` of them, the lowest cost kept, Lloyd iterations until no
    point changes cluster: on the demo's sample the same clusters and cost as Spark ML's (3418.4848 both) in
    0.7 s instead of 20-30 s of Spark jobs. Rows with a non-finite activation are left out, as Spark's path
    leaves out null ones; the same errors for too few points; centres in the same stable order.
    """
    from sklearn.cluster import KMeans as LocalKMeans

    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, got {restarts}")
    x = np.asarray(points, dtype=np.float64)
    x = x[np.isfinite(x).all(axis=1)] if x.ndim == 2 else x.reshape(0, 1)
    if len(x) == 0:
        raise InputError("no activations to cluster (no window has full history?)")
    distinct = len(np.unique(x, axis=0)) if len(x) <= 1_000_000 else len(np.unique(x[: 100 * k], axis=0))
    if distinct < k:
        raise InputError(f"k={k} phases requested but the activations have only {distinct} distinct points")
    fit = LocalKMeans(n_clusters=k, init="k-means++", n_init=int(restarts), max_iter=max_iter, tol=0.0,
                      random_state=int(seed), algorithm="lloyd").fit(x)
    centers = np.asarray(fit.cluster_centers_, dtype=np.float64)
    order = np.lexsort(centers.T[::-1])
    return centers[order]


def k_report(df: DataFrame, ks: Iterable[int], seed: int, column: str = "activations") -> list[tuple[int, float, float]]:
    """(k, silhouette, inertia) for each k, so a user can choose k; each is one distributed fit."""
    vectors = _vectors(df, column).cache()
    out = []
    try:
        evaluator = ClusteringEvaluator(featuresCol="v", predictionCol="prediction")
        for k in ks:
            model = KMeans(k=k, seed=seed, featuresCol="v", initMode="k-means||").fit(vectors)
            silhouette = evaluator.evaluate(model.transform(vectors))
            out.append((k, float(silhouette), float(model.summary.trainingCost)))
    finally:
        vectors.unpersist()
    return out


def adjusted_rand_index(contingency: np.ndarray) -> float:
    """ARI from a contingency table (rows: discovered phases, columns: true classes)."""
    c = np.asarray(contingency, dtype=np.int64)
    n = int(c.sum())
    if n < 2:
        return 1.0
    sum_cells = sum(comb(int(v), 2) for v in c.ravel())
    sum_rows = sum(comb(int(v), 2) for v in c.sum(1))
    sum_cols = sum(comb(int(v), 2) for v in c.sum(0))
    expected = sum_rows * sum_cols / comb(n, 2)
    maximum = (sum_rows + sum_cols) / 2
    if maximum == expected:
        return 1.0
    return float((sum_cells - expected) / (maximum - expected))


def contingency(df: DataFrame, predicted: str = "phase", truth: str = "behaviour") -> tuple[np.ndarray, list, list]:
    """Counts of (predicted, truth) pairs, aggregated in Spark; only the small table reaches the driver."""
    rows = (
        df.where(F.col(predicted).isNotNull() & F.col(truth).isNotNull())
        .groupBy(predicted, truth)
        .count()
        .collect()
    )
    preds = sorted({r[predicted] for r in rows})
    truths = sorted({r[truth] for r in rows})
    table = np.zeros((len(preds), len(truths)), dtype=np.int64)
    for r in rows:
        table[preds.index(r[predicted]), truths.index(r[truth])] = r["count"]
    return table, preds, truths
