"""spark-submit entry point: `spark-submit jobs/refine.py ... --conf conf/local.yaml [--set key=value ...]`."""

import sys

from ai4dl.cli import main

if __name__ == "__main__":
    sys.exit(main(["refine", *sys.argv[1:]]))
