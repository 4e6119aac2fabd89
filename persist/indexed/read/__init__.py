"""Reading collections: the part reader (``parts``), read plans and tasks (``scan``), key ranges
for parallel consolidation and consolidation itself (``split``, ``buckets``), filters (``filter``) and
stats pruning (``prune``)."""
