"""`python -m rollwire.cli`."""

import sys

from rollwire.cli import main

sys.exit(main())
