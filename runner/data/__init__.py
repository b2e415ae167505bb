"""Training and held-out batches that do not depend on the parallel layout."""
