"""The one place a SparkSession is made: Delta enabled, configured from the job config.

On Databricks (or any host that already started Spark) the active session is reused untouched: its cluster
owns master, JARs and memory, and a job must not fight it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from ai4dl.errors import SparkSetupError
from ai4dl.lake.tables import join_path

if TYPE_CHECKING:  # pragma: no cover
    from ai4dl.config import Config

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def build_spark_conf(cfg: "Config") -> dict[str, str]:
    """Spark properties for a job config, before Delta's JARs are added."""
    s = cfg.spark
    conf = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.sql.shuffle.partitions": str(s.shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": str(bool(s.arrow)).lower(),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(s.arrow_max_records_per_batch),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": str(s.driver_memory),
        "spark.ui.showConsoleProgress": "false",
        # Delta: let MERGE/overwrite evolve nothing silently; schemas are declared in ai4dl.schema.
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.sql.warehouse.dir": join_path(cfg.lake.root, "_warehouse"),
    }
    if s.ivy_cache:
        conf["spark.jars.ivy"] = str(Path(s.ivy_cache).absolute())
    conf.update({k: str(v) for k, v in (s.conf or {}).items()})
    return conf


def launched_by_spark_submit() -> bool:
    """spark-submit (or the pyspark shell) started the JVM before Python: its flags own master and JARs."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(cfg: "Config") -> SparkSession:
    """The active session if there is one (Databricks, a notebook, a test fixture), else a new Delta session.

    Under spark-submit the JVM already exists: ``--master``, ``--packages`` and ``--driver-memory`` given to
    spark-submit win over the config (the config's master is used only when spark-submit set none), and the
    Delta JARs must come from ``--packages``; a missing Delta is reported in one line instead of a
    ClassNotFoundException at the first table.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from delta import configure_spark_with_delta_pip
    from pyspark import SparkConf

    # Executors must run the same Python as the driver (a venv), also on a standalone cluster.
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_DRIVER_PYTHON", _python()))
    submitted = launched_by_spark_submit()
    builder = SparkSession.builder.appName(cfg.spark.app_name)
    if not (submitted and SparkConf().contains("spark.master")):
        builder = builder.master(cfg.spark.master)
    for key, value in build_spark_conf(cfg).items():
        builder = builder.config(key, value)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if submitted:
        _require_delta(spark)
    return spark


def _require_delta(spark: SparkSession) -> None:
    try:
        # Spark's own class loader: it holds the --packages JARs, the JVM's system loader does not.
        spark.sparkContext._jvm.org.apache.spark.util.Utils.classForName(DELTA_EXTENSION, False, False)
    except Exception:
        import pyspark

        minor = ".".join(pyspark.__version__.split(".")[:2])
        version = _delta_version()
        raise SparkSetupError(
            "Delta Lake JARs are not on the classpath of this spark-submit: add "
            f"--packages io.delta:delta-spark_{minor}_2.13:{version}"
        ) from None


def _delta_version() -> str:
    from importlib.metadata import version

    return version("delta-spark")


def _python() -> str:
    import sys

    return sys.executable
