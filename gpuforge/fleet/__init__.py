"""fleet room: reports about what the fleet runs: the support table and release notes from signed evidence
(support), and what moved upstream (outdated)."""
