"""Gold phase statistics for BI: the resource demand of each phase, per service and fleet-wide, and SQL views.

:func:`phase_statistics` writes one row per ``(service, phase)`` plus one fleet-wide row per phase whose
``service`` is the sentinel :data:`ALL_SERVICES` (``"__all__"``), all in the :data:`PHASE_STATS` schema. A BI
tool filters ``service = '__all__'`` for the fleet view and ``service <> '__all__'`` for the per-service one;
never sum the two.

:func:`create_bi_views` puts SQL names on the gold Delta tables.
"""

from __future__ import annotations

from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ai4dl.behaviour.sequences import conform
from ai4dl.lake.schema import PHASE_STATS, SERVICE
from ai4dl.lake.tables import delta_table

ALL_SERVICES = "__all__"  # service value of the fleet-wide rows
PERCENTILES = (0.5, 0.95, 0.99)
# percentile_approx accuracy: the returned value's rank is within samples / accuracy of the exact rank
# (Greenwald-Khanna sketch); 10000 is Spark's default, i.e. +-0.01 % of the group's samples.
DEFAULT_ACCURACY = 10_000



_METRICS = {"cpu": "cpu_usage_cores", "mem": "mem_current"}


def _metric_aggs(prefix: str, column: str, accuracy: int) -> tuple[list, list]:
    c = F.col(column).cast("double")
    q = f"_{prefix}_q"
    aggs = [
        F.avg(c).alias(f"{prefix}_mean"),
        F.stddev_samp(c).alias(f"{prefix}_std"),
        F.percentile_approx(c, list(PERCENTILES), accuracy).alias(q),
        F.max(c).alias(f"{prefix}_max"),
    ]
    post = [F.col(q)[i].alias(f"{prefix}_p{int(round(p * 100))}") for i, p in enumerate(PERCENTILES)]
    return aggs, post


def _with_all_rows(df: DataFrame, aggs: list) -> DataFrame:
    """One aggregation pass over grouping sets ``(service, phase)`` and ``(phase)``; the latter -> ``__all__``."""
    grouped = df.groupingSets([[F.col(SERVICE), F.col("phase")], [F.col("phase")]], SERVICE, "phase")
    out = grouped.agg(F.grouping(SERVICE).alias("_all"), *aggs)
    return out.withColumn(
        SERVICE, F.when(F.col("_all") == 1, F.lit(ALL_SERVICES)).otherwise(F.col(SERVICE))
    ).drop("_all")


def phase_statistics(phases_df: DataFrame, sequences_df: DataFrame, accuracy: int = DEFAULT_ACCURACY,
                     names: Mapping[int, str] | None = None) -> DataFrame:
    """Demand statistics per ``(service, phase)`` and per phase fleet-wide, in the :data:`PHASE_STATS` schema.

    All demand aggregates (mean, ``stddev_samp``, ``percentile_approx`` at ``accuracy`` for p50/p95/p99, max, for
    cpu and memory) are computed in one aggregation over grouping sets; dwell means come from a second, small
    aggregation of ``sequences_df`` (:data:`~ai4dl.schema.PHASE_SEQUENCES`) and are joined on.
    Steps with a null phase are not counted.
    """
    labelled = phases_df.where(F.col("phase").isNotNull())
    aggs: list = [F.count(F.lit(1)).alias("samples")]
    post: list = []
    for prefix, column in _METRICS.items():
        a, p = _metric_aggs(prefix, column, accuracy)
        aggs += a
        post += p
    demand = _with_all_rows(labelled, aggs)
    demand = demand.select("*", *post)

    dwell = _with_all_rows(
        sequences_df,
        [
            F.avg(F.col("duration_steps").cast("double")).alias("mean_dwell_steps"),
            F.avg(F.col("duration_seconds").cast("double")).alias("mean_dwell_seconds"),
        ],
    )
    stats = demand.join(dwell, on=[SERVICE, "phase"], how="left")
    # ``names``: the labelling model's (ai4dl.behaviour.naming); a phase it does not name is "phase k"
    default = F.concat(F.lit("phase "), F.col("phase").cast("string"))
    if names:
        lookup = F.create_map(*[x for p, n in sorted(names.items()) for x in (F.lit(int(p)), F.lit(str(n)))])
        stats = stats.withColumn("phase_name", F.coalesce(F.element_at(lookup, F.col("phase")), default))
    else:
        stats = stats.withColumn("phase_name", default)
    return conform(stats, PHASE_STATS)


VIEWS = ("ai4dl_phase_stats", "ai4dl_phase_summary", "ai4dl_phase_share", "ai4dl_phase_sequences",
         "ai4dl_phase_transitions")

GIB = 1 << 30
# The phase statistics as people read them (the ai4dl_phase_summary view, the report's table): CPU in cores,
# memory in GiB, shares in percent, dwell in minutes. (column, SQL over a PHASE_STATS table), declared once.
READABLE: tuple[tuple[str, str], ...] = (
    (SERVICE, SERVICE),
    ("phase", "phase"),
    ("phase_name", "phase_name"),
    ("steps", "samples"),
    ("share_of_steps_pct", f"ROUND(100.0 * samples / SUM(samples) OVER (PARTITION BY {SERVICE}), 1)"),
    ("cpu_mean_cores", "ROUND(cpu_mean, 3)"),
    ("cpu_p95_cores", "ROUND(cpu_p95, 3)"),
    ("cpu_max_cores", "ROUND(cpu_max, 3)"),
    ("mem_mean_gib", f"ROUND(mem_mean / {GIB}, 3)"),
    ("mem_p95_gib", f"ROUND(mem_p95 / {GIB}, 3)"),
    ("mem_max_gib", f"ROUND(mem_max / {GIB}, 3)"),
    ("mean_dwell_minutes", "ROUND(mean_dwell_seconds / 60.0, 1)"),
)


def readable_sql(source: str) -> str:
    """The :data:`READABLE` columns of a ``PHASE_STATS`` source (a table name or ``delta.`path```)."""
    columns = ",\n               ".join(f"{expr} AS {name}" for name, expr in READABLE)
    return f"SELECT {columns}\n        FROM {source}"


def readable_phase_stats(spark: SparkSession, stats_path: str) -> DataFrame:
    """The gold phase statistics in cores, GiB, percent and minutes (what the report shows)."""
    return spark.sql(readable_sql(delta_table(stats_path)))


def create_bi_views(spark: SparkSession, stats: str, sequences: str, transitions: str,
                    namespace: str | None = None) -> list[str]:
    """The BI views over the gold tables ``stats``, ``sequences`` and ``transitions`` (SQL table references:
    ``delta.`<path>``` or a catalog name); returns the view names (:data:`VIEWS`, qualified when persisted).

    * ``ai4dl_phase_stats`` - the :data:`PHASE_STATS` table as is (cores and bytes);
    * ``ai4dl_phase_summary`` - the same in the units people read (:data:`READABLE`: cores, GiB, percent of
      the service's steps, minutes);
    * ``ai4dl_phase_share`` - ``service, phase, samples, share``: the phase's fraction of the service's labelled
      samples (for ``service = '__all__'``: of the fleet's), so ``share`` sums to 1 per service;
    * ``ai4dl_phase_sequences`` - the run-length sequences (:data:`~ai4dl.schema.PHASE_SEQUENCES`);
    * ``ai4dl_phase_transitions`` - ``src, dst, count, probability``.

    Without ``namespace`` they are temporary views of this session. With it (``lake.schema``) they are persisted
    in that catalog schema, over the tables' catalog names, so a BI tool connected to the catalog (``ai4dl sql``,
    Databricks SQL) sees them; the tables are external Delta tables at the lake's paths, so the views always
    show the newest committed version.
    """
    create = f"CREATE OR REPLACE VIEW {namespace}." if namespace else "CREATE OR REPLACE TEMP VIEW "
    queries = {
        "ai4dl_phase_stats": f"SELECT * FROM {stats}",
        "ai4dl_phase_summary": readable_sql(stats),
        "ai4dl_phase_share": f"""SELECT {SERVICE}, phase, samples,
               CAST(samples AS DOUBLE) / SUM(samples) OVER (PARTITION BY {SERVICE}) AS share
        FROM {stats}""",
        "ai4dl_phase_sequences": f"SELECT * FROM {sequences}",
        "ai4dl_phase_transitions": f"SELECT * FROM {transitions}",
    }
    assert tuple(queries) == VIEWS
    for name, query in queries.items():
        spark.sql(f"{create}{name} AS {query}")
    return [f"{namespace}.{name}" if namespace else name for name in VIEWS]
