"""``python -m persist``: the operations command, the same as the ``persist`` console script
(see :mod:`persist.cli`)."""

import sys

from persist.cli import main

if __name__ == "__main__":
    sys.exit(main())
