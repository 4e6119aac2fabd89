"""Work done off the commit path: compaction (``compact``), garbage collection (``gc``) and the
fsck engine behind ``persist verify`` (``verify``)."""
