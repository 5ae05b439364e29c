"""Benchmark harness: load, statistics, reports and plots over the TorchServe control module (`tsctl`)."""
