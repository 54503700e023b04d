"""spark-submit entry point for the whole pipeline on the embedded default: `spark-submit jobs/demo.py`."""

import sys

from ai4dl.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
