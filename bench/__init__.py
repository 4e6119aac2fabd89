"""The side-by-side benchmark suite: persist against delta-rs, pyiceberg and the storage floor.

Run it with ``python -m bench.run [--quick] [--out DIR]``; see ``bench/README.md``.
"""
