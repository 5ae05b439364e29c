"""Length-aware bucketing for transformer text inference under TorchServe."""
