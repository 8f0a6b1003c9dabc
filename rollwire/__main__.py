"""`python -m rollwire` is the `rollwire` command."""

import sys

from rollwire.cli import main

if __name__ == "__main__":  # not when a spawned child process imports it (`rollwire run` builds its base in one)
    sys.exit(main())
