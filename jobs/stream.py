"""spark-submit entry point: `spark-submit jobs/stream.py --conf conf/local.yaml [--trigger continuous] [--set key=value ...]`.

On Databricks: a Python-script task running this file (the active session is reused); see README, "Live stream".
"""

import sys

from ai4dl.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
