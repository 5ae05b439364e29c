"""Planning a delivered batch: the cost model and planner (which rows share a padded pass), the continuous
scheduler's pick, calibration of the cost model at start, and continuous batching's pool across calls."""
