"""A throwaway Spark standalone cluster on loopback, and a driver that runs the pipeline against it.

``StandaloneCluster`` starts a master and its workers (one by default) from the pyspark pip install
(``bin/spark-class``) as subprocesses in their own process groups, waits until the master reports the workers
ALIVE, and kills every group (executors and Python workers included) on ``stop()``.

``python -m tests.standalone MASTER_URL LAKE MODELS SAMPLE REFERENCE_MODEL`` is the driver: one Spark
application running import-reference-model -> ingest -> window -> label -> policies through the library, as
``ai4dl`` does, then printing one ``RESULT {json}`` line (master, executors, what was written).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IVY_CACHE = ROOT / ".cache" / "ivy"
RESULT_PREFIX = "RESULT "


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_env(conf_dir: Path) -> dict[str, str]:
    """Environment for master, worker and driver: loopback, the venv's Python, the pip pyspark as SPARK_HOME."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="localhost",
        SPARK_CONF_DIR=str(conf_dir),  # empty: no stray spark-defaults/spark-env from the machine
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    if "JAVA_HOME" not in env:
        java = _which("java")
        if java is not None:
            env["JAVA_HOME"] = str(Path(java).resolve().parents[1])
    return env


def _which(cmd: str) -> str | None:
    import shutil

    return shutil.which(cmd)


def kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc`` (started with start_new_session), SIGKILL what is left after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)  # anything left in the group (executors, python daemons)?
            except ProcessLookupError:
                return
            time.sleep(0.2)


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1, free ports, logs and work
    dirs under ``base``."""

    def __init__(self, base: Path, cores: int = 2, memory: str = "2g", workers: int = 1) -> None:
        self.base = Path(base)
        self.cores = cores
        self.memory = memory
        self.workers = workers
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[str, Path] = {}
        conf_dir = self.base / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        self.env = cluster_env(conf_dir)

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.base / f"{name}.log"
        self.logs[name] = log
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.base, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> "StandaloneCluster":
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self.wait_for(lambda s: s.get("status") == "ALIVE", "the master to come up", timeout)
        for i in range(self.workers):
            work = self.base / ("work" if i == 0 else f"work{i}")
            work.mkdir(exist_ok=True)
            self._start(
                "worker" if i == 0 else f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--cores", str(self.cores), "--memory", self.memory,
                    "--host", "127.0.0.1", "--webui-port", str(free_port()), "--work-dir", str(work),
                ],
            )  # fmt: skip
        self.wait_for(lambda s: sum(w.get("state") == "ALIVE" for w in s.get("workers", [])) >= self.workers,
                      f"{self.workers} worker(s) to register", timeout)
        return self

    def state(self) -> dict:
        """The master's JSON status (workers, active and completed applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def wait_for(self, predicate, what: str, timeout: float) -> dict:
        deadline = time.time() + timeout
        last: object = None
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[1]} exited with {p.returncode} while waiting for {what}\n{self.log_text()}")
            try:
                last = self.state()
                if predicate(last):
                    return last
            except OSError as exc:  # UI not up yet
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last master state: {last}\n{self.log_text()}")

    def log_text(self, tail: int = 4000) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {name} log ({path}) ---\n{text[-tail:]}")
        for app_log in sorted(self.base.glob("work*/app-*/*/stderr")):  # executor logs
            parts.append(f"--- executor {app_log} ---\n{app_log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):  # worker (and its executors) first, then the master
            kill_group(p)
        self.procs.clear()


def driver_command(master_url: str, lake: Path, models: Path, sample: Path, reference_model: Path) -> list[str]:
    return [sys.executable, "-m", "tests.standalone", master_url, str(lake), str(models), str(sample), str(reference_model)]


def drive(master_url: str, lake: str, models: str, sample: str, reference_model: str) -> dict:
    """One Spark application on ``master_url``: the stages ``ai4dl`` runs, through the stage layer."""
    from ai4dl import stages
    from ai4dl.config import load_config
    from ai4dl.lake.session import get_spark

    cfg = load_config(
        None,
        [
            f"spark.master={master_url}",
            "spark.app_name=ai4dl-cluster-test",
            "spark.shuffle_partitions=2",
            "spark.driver_memory=1g",
            f"spark.ivy_cache={IVY_CACHE}",
            'spark.conf={"spark.executor.memory": "1g", "spark.executor.cores": "2", "spark.cores.max": "2", '
            '"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}',
            f"lake.root={lake}",
            f"lake.models={models}",
            f"report.dir={Path(lake).parent / 'report'}",
        ],
    )
    spark = get_spark(cfg)
    sc = spark.sparkContext
    # Executors register asynchronously; make sure the work below runs on one, not only the driver.
    executors = _wait_for_executors(sc, timeout=60.0)
    model_dir = stages.import_reference_model(cfg, spark, path=reference_model).details["path"]
    result = stages.ingest(cfg, spark, input=sample).details["result"]
    windows = stages.window(cfg, spark, scaler_from_model=model_dir).written
    labelled = stages.label(cfg, spark, model=model_dir).written
    stages.policies(cfg, spark)
    # The Python the executors' tasks run: the venv's (PYSPARK_PYTHON), not whatever python3 is on the PATH.
    task_pythons = sorted(set(sc.parallelize(range(4), 2).map(lambda _: sys.prefix).collect()))
    out = {
        "master": sc.master,
        "app_id": sc.applicationId,
        "executors": executors,
        "executors_at_end": sc._jsc.sc().getExecutorMemoryStatus().size() - 1,
        "task_pythons": task_pythons,
        "inserted": result.inserted,
        "windows": windows,
        "labelled": labelled,
        "pyspark_python": os.environ.get("PYSPARK_PYTHON"),
    }
    spark.stop()
    return out


def _wait_for_executors(sc, timeout: float) -> int:
    """Executors registered with the driver (getExecutorMemoryStatus counts the driver too)."""
    deadline = time.time() + timeout
    while True:
        n = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        if n >= 1 or time.time() > deadline:
            return n
        time.sleep(0.5)


if __name__ == "__main__":
    out = drive(*sys.argv[1:6])
    print(RESULT_PREFIX + json.dumps(out, default=str), flush=True)
