"""The one place a SparkSession is made: Delta enabled, configured from the job config.

On Databricks (or any host that already started Spark) the active session is reused untouched: its cluster
owns master, JARs and memory, and a job must not fight it.

Delta's JARs: Spark's own ``spark.jars.packages`` resolves them with Ivy at every start, printing some 140
lines (more, with "host not found" and proxy warnings, when a default repository is unreachable) and spending
seconds on network checks even when everything is cached. Instead :func:`delta_jars` resolves them once, with
Ivy from Maven Central only and its output captured, into ``spark.ivy_cache``, and records the resulting
classpath there; every later start passes those files as ``spark.jars``: no resolver, no network, no output.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from ai4dl.errors import SparkSetupError
from ai4dl.lake.tables import is_uri, join_path

if TYPE_CHECKING:  # pragma: no cover
    from ai4dl.config import Config

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")


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
        # Delta rebuilds a table's state from its log with this many tasks (default 50) every time it takes a
        # snapshot: several times per stage. ai4dl's logs are small (a checkpoint every 10 commits), so as
        # many tasks as shuffle partitions: measured on 220k rows in a warm session, ingest + window + label
        # went from 65 s to 43 s. A lake with very long logs can raise it with spark.conf.
        "spark.databricks.delta.snapshotPartitions": str(s.shuffle_partitions),
        # The DataFrames ai4dl caches (ingest's typed rows, window's rows with derived features) are read once or
        # twice right after: encoding them into compressed columns costs more CPU than the memory it saves
        # (window at 10M rows: 70-73 s -> 62-65 s, JVM peak RSS +0.8 GB). A memory-tight cluster can turn it back on.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Timestamps written as Parquet's standard TIMESTAMP(MICROS), not Spark's legacy INT96 default: the
        # files stay readable by engines that read the lake without Spark (delta-rs, DuckDB, Polars).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }
    # Warnings and errors only, from the first line on (setLogLevel comes after the start-up chatter).
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}"
    if cfg.lake.schema is not None:
        conf["spark.sql.catalogImplementation"] = "hive"  # a catalog that keeps the lake's names
        folder = local_metastore(cfg)
        if folder is not None:
            conf[METASTORE_URL] = f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true"
            conf["spark.driver.extraJavaOptions"] += f" -Dderby.stream.error.file={folder / 'derby.log'}"
    if s.ivy_cache:
        conf["spark.jars.ivy"] = str(Path(s.ivy_cache).absolute())
    for key, value in (s.conf or {}).items():
        if key == "spark.driver.extraJavaOptions":  # the user's options come after ours, not instead of them
            value = f"{conf[key]} {value}"
        conf[key] = str(value)
    return conf


METASTORE_URL = "spark.hadoop.javax.jdo.option.ConnectionURL"


def metastore_folder(root: str) -> Path:
    """Where a local lake keeps its embedded metastore (the catalog of its named tables and views)."""
    return Path(join_path(root, "_metastore"))


def local_metastore(cfg: "Config") -> Path | None:
    """The embedded Derby metastore folder of a lake with named tables (``lake.schema``), when it has one: a
    local lake whose user named no metastore of their own (``spark.conf``'s ConnectionURL, or a URI lake with its
    cluster's hive-site.xml). There the names outlive the session and belong to the lake, not to the working
    directory. Embedded Derby admits one process at a time: a lake served by ``ai4dl sql`` while jobs run needs
    a metastore server."""
    if cfg.lake.schema is None or is_uri(cfg.lake.root) or METASTORE_URL in (cfg.spark.conf or {}):
        return None
    return metastore_folder(cfg.lake.root)


def require_metastore_free(root: str) -> None:
    """Refuse at once, in one line, to start on a local metastore another process has open.

    Embedded Derby admits one JVM per database; a second one otherwise fails deep in the Hive client after
    pages of stack traces. Derby holds an OS lock on ``dbex.lck`` while the database is booted (Java's file
    locks are POSIX record locks on Linux): trying that lock, and releasing it, tells whether someone has it."""
    import fcntl

    lock = metastore_folder(root) / "metastore_db" / "dbex.lck"
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return  # no database yet, or not ours to check
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise SparkSetupError(
            f"the lake's metastore {lock.parent} is open in another process (an `ai4dl sql` server?): embedded Derby "
            "admits one at a time; stop it, or give the lake a metastore server "
            f"(spark.conf {METASTORE_URL}=jdbc:postgresql://...)"
        ) from None
    finally:
        os.close(fd)  # closing releases the lock, if we got it


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
    conf = build_spark_conf(cfg)
    resolved = bool(cfg.spark.ivy_cache) and not submitted
    if resolved:
        jars = delta_jars(cfg.spark.ivy_cache)
        conf["spark.jars"] = ",".join([*filter(None, conf.get("spark.jars", "").split(",")), *jars])
    archive = None
    if resolved and cfg.spark.class_archive and not _user_archive_options(conf["spark.driver.extraJavaOptions"]):
        try:
            archive = ClassArchive.for_classpath(Path(cfg.spark.ivy_cache), jars)
        except OSError:  # a read-only cache: start without the archive rather than not at all
            archive = None
        if archive is not None:
            conf["spark.driver.extraJavaOptions"] += " " + archive.java_options()
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not resolved:  # no cache to resolve into (or spark-submit's own --packages): Spark's Ivy, as before
        builder = configure_spark_with_delta_pip(builder)
    metastore = local_metastore(cfg)
    if metastore is not None:
        metastore.mkdir(parents=True, exist_ok=True)  # Derby's log goes there from the start
        require_metastore_free(cfg.lake.root)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if archive is not None and not archive.ready:
        archive.finish_at_exit(spark)
    if submitted:
        _require_delta(spark)
    return spark


MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


def _user_archive_options(java_options: str) -> bool:
    return any(o in java_options for o in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare"))


class ClassArchive:
    """A dynamic class-data-sharing (CDS) archive of the classes the driver JVM loads: Spark's, Delta's, Scala's.

    A local command spends most of its first seconds loading and verifying some 20,000 classes; mapped from an
    archive, a fresh process starting a session and writing, reading and overwriting a small Delta table took
    17.2 s instead of 22.8 s here (``bench/jvm_start.py``, 2 cores, JDK 17).
    The first run with a given JVM and classpath starts with ``-XX:ArchiveClassesAtExit``: the JVM writes the
    archive as it exits. Python then stops the session, closes the JVM's stdin (the gateway exits on EOF),
    waits for the dump and moves the file into place only if the JVM exited cleanly. The move is what makes it
    safe: a JVM given a truncated archive crashes, so only a complete file ever carries the final name. Every
    later run passes ``-XX:SharedArchiveFile``. The name hashes the java binary and the classpath, so a new JDK,
    pyspark or Delta gets its own archive; a JVM that still cannot use one starts without it (its CDS log
    lines are silenced). ``spark.class_archive: false`` turns it off.
    """

    SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"

    def __init__(self, path: Path):
        self.path = path
        self.ready = path.is_file()
        self.partial = path.with_name(f"{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")

    @classmethod
    def for_classpath(cls, ivy_cache: Path, jars: list[str]) -> "ClassArchive":
        import hashlib
        import shutil

        import pyspark

        java = Path(shutil.which(_java()) or _java()).resolve()
        stat = java.stat() if java.exists() else None
        spark_jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
        key = json.dumps([str(java), stat and [stat.st_size, int(stat.st_mtime)], pyspark.__version__, spark_jars, jars])
        folder = Path(ivy_cache).absolute() / "ai4dl-jvm"
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.part"):  # left by a JVM killed while dumping
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink(missing_ok=True)
        return cls(folder / f"classes-{hashlib.sha1(key.encode()).hexdigest()[:16]}.jsa")

    def java_options(self) -> str:
        if self.ready:
            return f"-XX:SharedArchiveFile={self.path} {self.SILENT}"
        return f"-XX:ArchiveClassesAtExit={self.partial} {self.SILENT}"

    def finish_at_exit(self, spark: SparkSession) -> None:
        import atexit

        atexit.register(self._finish, spark)

    def _finish(self, spark: SparkSession) -> None:
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        try:
            if proc is None or proc.poll() is not None or proc.stdin is None:
                return
            spark.stop()
            proc.stdin.close()  # the gateway exits on EOF; the archive is written on the way out
            if proc.wait(timeout=300) == 0 and self.partial.is_file() and self.partial.stat().st_size > 0:
                os.replace(self.partial, self.path)
        except Exception:  # an archive is only ever a speed-up: never fail a finished job over it
            pass
        finally:
            self.partial.unlink(missing_ok=True)


IVY_SETTINGS_NAME = "ai4dl-ivysettings.xml"
# The chain is named as Spark's own, so JARs Spark's --packages cached earlier are found offline.
IVY_SETTINGS = f"""<ivysettings>
  <settings defaultResolver="spark-list"/>
  <resolvers>
    <chain name="spark-list">
      <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
    </chain>
  </resolvers>
</ivysettings>
"""


def delta_coordinates() -> tuple[str, str, str]:
    """(organisation, artifact, version) of the Delta JAR matching the installed pyspark and delta-spark."""
    import pyspark

    minor = ".".join(pyspark.__version__.split(".")[:2])
    return "io.delta", f"delta-spark_{minor}_2.13", _delta_version()


def delta_jars(ivy_cache: str | Path, log: Any = print) -> list[str]:
    """Local paths of the Delta JARs and their dependencies, resolved once into ``ivy_cache``.

    The classpath is recorded in ``ivy_cache/ai4dl-<artifact>-<version>.classpath``; while every file it lists
    exists, nothing is resolved and nothing is printed. Otherwise Ivy (the JAR pyspark ships) runs in a child
    JVM with Maven Central as its only repository, the Scala library and Spark excluded as Spark's
    ``--packages`` excludes them; its output is captured, and one line says what is happening. A failure is a
    :class:`SparkSetupError` of one line with Ivy's last error.
    """
    cache = Path(ivy_cache).absolute()
    org, artifact, version = delta_coordinates()
    manifest = cache / f"ai4dl-{artifact}-{version}.classpath"
    if manifest.exists():
        jars = [j for j in manifest.read_text().split(os.pathsep) if j.strip()]
        if jars and all(Path(j).is_file() for j in jars):
            return jars
    log(f"ai4dl: fetching Delta Lake {version} JARs from Maven Central into {cache} (once; later runs are offline)")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / IVY_SETTINGS_NAME).write_text(IVY_SETTINGS)
    module = f"""<ivy-module version="2.0">
  <info organisation="ai4dl" module="delta-jars"/>
  <dependencies>
    <dependency org="{org}" name="{artifact}" rev="{version}" conf="default->default(runtime)"/>
    <exclude org="org.scala-lang" module="scala-library"/>
    <exclude org="org.apache.spark"/>
  </dependencies>
</ivy-module>
"""
    with tempfile.TemporaryDirectory(prefix="ai4dl-ivy-") as tmp:
        ivy_xml, classpath = Path(tmp) / "ivy.xml", Path(tmp) / "classpath"
        ivy_xml.write_text(module)
        cmd = [
            _java(), f"-Divy.default.ivy.user.dir={cache}", "-cp", _ivy_jar(), "org.apache.ivy.Main",
            "-settings", str(cache / IVY_SETTINGS_NAME), "-cache", str(cache / "cache"), "-ivy", str(ivy_xml),
            "-confs", "default", "-cachepath", str(classpath), "-warn",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SparkSetupError(f"cannot run Ivy to fetch the Delta Lake JARs: {exc}") from None
        jars = [j for j in (classpath.read_text().strip().split(os.pathsep) if classpath.exists() else []) if j]
        if done.returncode != 0 or not jars or not all(Path(j).is_file() for j in jars):
            errors = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip() and not ln.startswith("::")]
            last = errors[-1] if errors else f"exit status {done.returncode}"
            raise SparkSetupError(
                f"could not fetch {org}:{artifact}:{version} from Maven Central into {cache} ({last}); "
                "check network access to repo1.maven.org (a proxy: JAVA_TOOL_OPTIONS=-Dhttps.proxyHost=...)"
            )
    tmp_manifest = manifest.with_suffix(f".tmp{os.getpid()}")
    tmp_manifest.write_text(os.pathsep.join(jars))
    os.replace(tmp_manifest, manifest)
    return jars


def _ivy_jar() -> str:
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not found:
        raise SparkSetupError("pyspark ships no Ivy JAR (pyspark/jars/ivy-*.jar): reinstall pyspark")
    return str(found[-1])


def _java(tool: str = "java") -> str:
    """A JDK tool (``java``, ``javac``) of ``JAVA_HOME`` when it is set, else the name for the PATH."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / tool) if home else tool


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


def prepare_local_start(cfg: "Config | None" = None) -> None:
    """Fetch Delta's JARs and write the JVM class archive now, so the first real command starts as fast as
    later ones (``make install`` runs it). A session runs a small Delta write, MERGE and read in a temporary
    lake, which loads the classes every stage needs; nothing is done when both are already in the cache."""
    from ai4dl.config import load_config

    cfg = cfg or load_config(None)
    if not cfg.spark.ivy_cache or launched_by_spark_submit():
        return
    jars = delta_jars(cfg.spark.ivy_cache)
    if not cfg.spark.class_archive or ClassArchive.for_classpath(Path(cfg.spark.ivy_cache), jars).ready:
        return
    print("ai4dl: writing the JVM class archive (once; later Spark starts are faster)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ai4dl-warm-") as tmp:
        spark = get_spark(load_config(None, [f"lake.root={tmp}/lake", f"spark.ivy_cache={cfg.spark.ivy_cache}"]))
        path = f"{tmp}/lake/warm"
        spark.range(0, 1000).selectExpr("id", "id % 7 AS k").write.format("delta").save(path)
        spark.range(500, 1500).selectExpr("id", "id % 7 AS k").createOrReplaceTempView("ai4dl_warm")
        spark.sql(f"MERGE INTO delta.`{path}` t USING ai4dl_warm s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")
        spark.read.format("delta").load(path).groupBy("k").count().collect()
        spark.stop()
