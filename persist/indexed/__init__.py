"""The engine: named, definite collections over a blob store (``engine.Indexed``), in four
parts: ``format`` (what is stored), ``state`` (the metadata log and its pure transitions),
``read`` (parts, plans and tasks) and ``maintenance`` (compaction, GC, verify)."""
