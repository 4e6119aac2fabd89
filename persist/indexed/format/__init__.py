"""What goes to storage, and how: versioned metadata records (``meta``), Arrow parts and their
codecs (``columnar``), record types (``records``), per-part stats (``stats``), schema versions
and migration (``evolve``), and writing a part (``write``)."""
