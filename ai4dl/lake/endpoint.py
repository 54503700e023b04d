"""``ai4dl sql``: a JDBC/ODBC endpoint a BI tool connects to, over the lake's named tables, read-only for it.

It is Spark's own Thrift server (HiveServer2's protocol; it ships in the pyspark install), started inside one
local Spark session over the lake's catalog (``lake.schema``, default ``ai4dl``): Power BI, Tableau, Superset,
DBeaver or beeline connect with a Hive/Spark SQL driver to ``jdbc:hive2://host:port/<schema>``.

Before serving, the session names every table the lake has (external Delta tables at their paths, see
:meth:`ai4dl.lake.tables.Lake.register`) and persists the BI views, so a lake written without ``lake.schema``
is served as well. Then the read-only guard is armed: a Spark session extension (``readonly/
ReadOnlyExtension.java``, compiled once with the JDK's ``javac`` into the cache) whose check rule refuses,
in every client session, any command that is not reading (SHOW, DESCRIBE, EXPLAIN, USE, SET) and calls of
Java methods by reflection. Spark has no read-only mode of its own; the guard is a statement filter, not a
sandbox: clients still read whatever the server's user can read (``SELECT * FROM parquet.`/any/path```), so
the server binds to loopback unless a host is given, and exposing it means turning on its authentication
(``hive.server2.authentication``: LDAP, KERBEROS or CUSTOM, and TLS; see the README).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ai4dl.errors import SparkSetupError

GUARD_SOURCE = Path(__file__).with_name("readonly") / "ReadOnlyExtension.java"
GUARD_CLASS = "ai4dl.spark.ReadOnlyExtension"
DEFAULT_PORT = 10000
DEFAULT_SCHEMA = "ai4dl"
LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


def guard_jar(cache: str | Path) -> Path:
    """The read-only guard's JAR, compiled once per source and Spark version into ``cache/ai4dl-jvm``.

    Written to a temporary name and moved into place, so a build killed half-way never leaves a JAR a server
    would load. Needs a JDK (``javac``); a JRE alone is refused in one line saying what to install."""
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha1(GUARD_SOURCE.read_bytes() + pyspark.__version__.encode()).hexdigest()[:16]
    folder = Path(cache).absolute() / "ai4dl-jvm"
    jar = folder / f"readonly-{key}.jar"
    if jar.is_file():
        return jar
    javac = _javac()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ai4dl-guard-") as tmp:
        classes = Path(tmp) / "classes"
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", str(spark_jars / "*"), "-d", str(classes),
                               str(GUARD_SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SparkSetupError(f"could not compile the read-only guard of ai4dl sql: {done.stderr.strip()[:500]}")
        partial = folder / f"{jar.name}.{os.getpid()}.part"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                z.write(path, path.relative_to(classes).as_posix())
        os.replace(partial, jar)
    return jar


def _javac() -> str:
    """JAVA_HOME's javac, else the PATH's (JAVA_HOME may name a JRE)."""
    from ai4dl.lake.session import _java

    found = shutil.which(_java("javac")) or shutil.which("javac")
    if found:
        return found
    raise SparkSetupError("ai4dl sql compiles its read-only guard once with a JDK's javac, and none was found: "
                          "install one (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to a JDK")


def _artifact(jar: str) -> str:
    """``jackson-databind-2.13.5.jar`` -> ``jackson-databind``."""
    return re.sub(r"[-_][0-9][^/]*\.jar$", "", Path(jar).name)


def _not_in_spark(jars: list[str]) -> list[str]:
    """The JARs whose artifact Spark does not ship itself: on the driver's class path they come before Spark's,
    so an older copy of one of Spark's own (Delta's resolution brings jackson 2.13) would shadow it."""
    import pyspark

    ships = {_artifact(str(j)) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in jars if _artifact(j) not in ships]


def is_loopback(host: str) -> bool:
    return host in _LOOPBACK_NAMES or host.startswith("127.")


def server_config(cfg: Any, port: int, host: str) -> Any:
    """The job config of the server's session: the lake's schema (default ``ai4dl``), Delta's and the guard's
    extensions, and the Thrift server's port and address (a user's own ``hive.server2.*`` keys kept)."""
    from ai4dl.lake.session import DELTA_EXTENSION

    from ai4dl.lake.session import delta_jars

    if not cfg.spark.ivy_cache:
        raise SparkSetupError("ai4dl sql needs spark.ivy_cache (the folder Delta's JARs are resolved into)")
    user = dict(cfg.spark.conf or {})
    # The server runs each client's statements on threads of its own, whose class loader is the JVM's: Delta's
    # classes and the guard's must be on the driver's own class path, not only in spark.jars.
    jars = [*_not_in_spark(delta_jars(cfg.spark.ivy_cache)), str(guard_jar(cfg.spark.ivy_cache))]
    classpath = os.pathsep.join(filter(None, [str(user.get("spark.driver.extraClassPath", "")), *jars]))
    theirs = [e.strip() for e in str(user.get("spark.sql.extensions", "")).split(",")]
    extensions = ",".join([DELTA_EXTENSION, *(e for e in theirs if e and e not in (DELTA_EXTENSION, GUARD_CLASS)),
                           GUARD_CLASS])
    conf = {
        **user,
        "spark.driver.extraClassPath": classpath,
        "spark.sql.extensions": extensions,
        "spark.hadoop.hive.server2.thrift.port": str(int(port)),
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.transport.mode": user.get("spark.hadoop.hive.server2.transport.mode", "binary"),
        # One Spark session per connection (Spark's default), so one client's SET does not reach another's.
        "spark.sql.hive.thriftServer.singleSession": "false",
    }
    lake = {"schema": cfg.lake.schema or DEFAULT_SCHEMA}
    return cfg.replace(spark={"conf": conf}, lake=lake)


@dataclass
class Endpoint:
    """A started server: its session, the named tables and views it serves, where clients connect."""

    spark: Any
    server: Any
    url: str
    tables: list[str]
    views: list[str]

    def stop(self) -> None:
        """Stop the server, then the session; a JVM already gone (its process group was killed) is not an error
        of ours: there is nothing left to stop."""
        from py4j.protocol import Py4JError

        try:
            self.server.stop()
            self.spark.stop()
        except Py4JError:
            pass


def register_lake(spark: Any, cfg: Any) -> tuple[list[str], list[str]]:
    """Name every table the lake has and persist the BI views over the gold ones; (tables, views)."""
    from ai4dl.behaviour.phase_stats import create_bi_views
    from ai4dl.lake.tables import TABLES, Lake

    lake = Lake.for_config(spark, cfg)
    tables = []
    for name in TABLES:
        if lake.exists(name):
            lake.register(name)
            tables.append(lake.table(name))
    views: list[str] = []
    if all(lake.exists(n) for n in ("phase_stats", "sequences", "transitions")):
        views = create_bi_views(spark, lake.table("phase_stats"), lake.table("sequences"), lake.table("transitions"),
                                lake.namespace)
    return tables, views


def start(cfg: Any, port: int = DEFAULT_PORT, host: str = LOOPBACK) -> Endpoint:
    """Start the server over the lake of ``cfg`` (see the module's docstring); returns once clients can connect."""
    from ai4dl.lake.session import get_spark

    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:  # a notebook's or spark-submit's: it has no guard, and is not ours
        raise SparkSetupError("ai4dl sql starts its own Spark session (run it as `ai4dl sql`, not inside another session)")
    cfg = server_config(cfg, port, host)
    spark = get_spark(cfg)
    tables, views = register_lake(spark, cfg)
    jvm = spark.sparkContext._jvm
    guard = jvm.org.apache.spark.util.Utils.classForName(GUARD_CLASS, True, False)  # Spark's loader: the one of the rule
    gateway = spark.sparkContext._gateway
    no_types = gateway.new_array(jvm.java.lang.Class, 0)
    guard.getMethod("arm", no_types).invoke(None, gateway.new_array(jvm.java.lang.Object, 0))
    # The server cancels each statement's job group when the statement ends, and Spark warns for every group
    # that had no job left to cancel: a line per query that says nothing.
    levels = jvm.org.apache.logging.log4j.Level
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("org.apache.spark.scheduler.DAGScheduler", levels.ERROR)
    server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(spark._jsparkSession.sqlContext())
    url = f"jdbc:hive2://{host}:{int(port)}/{cfg.lake.schema}"
    return Endpoint(spark, server, url, tables, views)


def serve(cfg: Any, port: int = DEFAULT_PORT, host: str = LOOPBACK) -> None:
    """``ai4dl sql``: start, say where, serve until interrupted (Ctrl-C or SIGTERM), stop cleanly."""
    auth = str((cfg.spark.conf or {}).get("spark.hadoop.hive.server2.authentication", "NONE")).upper()
    endpoint = start(cfg, port, host)
    print(f"sql: serving {len(endpoint.tables)} tables and {len(endpoint.views)} views of {cfg.lake.root} read-only "
          f"at {endpoint.url} (Ctrl-C stops)", flush=True)
    if not is_loopback(host) and auth in ("NONE", "NOSASL"):
        print(f"sql: WARNING: {host} is reachable from other machines and authentication is {auth}: anyone who "
              "reaches the port reads the lake (see the README, 'A SQL endpoint for BI tools')", flush=True)
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        while not stopped.wait(1.0):
            pass
    finally:
        endpoint.stop()
        print("sql: stopped", flush=True)
