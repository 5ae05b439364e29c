"""Planning a delivered batch, pure (no torch, nothing of the serving loop): the cost model and planner (which rows
share a padded pass), the continuous scheduler's pick, and calibration of the cost model at start."""
