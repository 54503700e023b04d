"""The one place a SparkSession is made: Delta enabled, configured from the job config.

On Databricks (or any host that already started Spark) the active session is reused untouched: its cluster
owns master, JARs and memory, and a job must not fight it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def build_spark_conf(cfg: dict[str, Any]) -> dict[str, str]:
    """Spark properties for a job config, before Delta's JARs are added."""
    s = cfg["spark"]
    conf = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.sql.shuffle.partitions": str(s["shuffle_partitions"]),
        "spark.sql.execution.arrow.pyspark.enabled": str(bool(s["arrow"])).lower(),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(s["arrow_max_records_per_batch"]),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": str(s["driver_memory"]),
        "spark.ui.showConsoleProgress": "false",
        # Delta: let MERGE/overwrite evolve nothing silently; schemas are declared in ai4dl.schema.
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.sql.warehouse.dir": str(Path(cfg["lake"]["root"]).absolute() / "_warehouse"),
    }
    if s.get("ivy_cache"):
        conf["spark.jars.ivy"] = str(Path(s["ivy_cache"]).absolute())
    conf.update({k: str(v) for k, v in (s.get("conf") or {}).items()})
    return conf


def get_spark(cfg: dict[str, Any]) -> SparkSession:
    """The active session if there is one (Databricks, a notebook, a test fixture), else a new Delta session."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from delta import configure_spark_with_delta_pip

    # Executors must run the same Python as the driver (a venv), also on a standalone cluster.
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_DRIVER_PYTHON", _python()))
    builder = SparkSession.builder.master(cfg["spark"]["master"]).appName(cfg["spark"]["app_name"])
    for key, value in build_spark_conf(cfg).items():
        builder = builder.config(key, value)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _python() -> str:
    import sys

    return sys.executable
