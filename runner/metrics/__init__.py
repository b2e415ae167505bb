"""What a step and a run are measured by, and the sinks the measurements go to."""
