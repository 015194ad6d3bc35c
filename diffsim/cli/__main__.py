"""`python -m diffsim.cli`."""

import sys

from diffsim.cli import main

sys.exit(main())
