"""`python -m diffsim ...`: the same command as the `diffsim` console script."""

import sys

from diffsim.cli import main

if __name__ == "__main__":
  sys.exit(main())
