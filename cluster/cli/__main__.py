"""`python -m cluster.cli`: the commands of the cluster layer and below,
without the chaos harness's. The backends start nodes this way
(`python -m cluster.cli node ...`), so a node process loads no chaos module."""

import sys

from cluster.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
