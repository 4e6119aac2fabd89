"""The metadata state and its log: pure state transitions (``transitions``), the log and its
rollups (``machine``), seal history (``history``) and staging leases (``lease``)."""
