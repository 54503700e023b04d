"""spark-submit entry point: `spark-submit jobs/import_reference_model.py ... --conf conf/local.yaml [--set key=value ...]`."""

import sys

from ai4dl.cli import main

if __name__ == "__main__":
    sys.exit(main(["import-reference-model", *sys.argv[1:]]))
