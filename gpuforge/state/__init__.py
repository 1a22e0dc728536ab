"""state stage: the typed, versioned, crash-safe records (builds, promotions) and the atomic file writer
that reports use too."""
