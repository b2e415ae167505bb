"""The files of a run directory: summary.json, checkpoint records, failure records, identity."""
