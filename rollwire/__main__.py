"""`python -m rollwire` is the `rollwire` command."""

import sys

from rollwire.cli import main

sys.exit(main())
