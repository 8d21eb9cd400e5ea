"""``python -m shardplan``: the command line."""

import sys

from shardplan.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
