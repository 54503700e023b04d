"""spark-submit entry point for several stages in one application (one JVM, one Delta start):
`spark-submit jobs/run.py ingest window label behaviour policies --conf conf/cluster.yaml`."""

import sys

from ai4dl.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
