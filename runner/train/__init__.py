"""One rank's training: set up, step, loop, evaluate, stop at a signal, summarise."""
