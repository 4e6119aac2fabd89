"""``python -m persist``: the operations command, the same as the ``persist`` console script
(see :mod:`persist.cli`)."""

from persist.cli import run

if __name__ == "__main__":
    run()
