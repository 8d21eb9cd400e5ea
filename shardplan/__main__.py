import sys

from shardplan.cli.main import main

sys.exit(main())
