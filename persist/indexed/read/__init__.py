"""Reading collections: the part reader (``parts``), read plans and tasks (``scan``), key ranges
and hash buckets for parallel consolidation (``split``, ``buckets``), filters (``filter``) and
stats pruning (``prune``)."""
