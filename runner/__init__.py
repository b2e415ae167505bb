"""ladder's library: typed config, batch contract, model, data, DeepSpeed engine, loop, estimators."""
