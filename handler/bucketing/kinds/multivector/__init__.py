"""The multi-vector kind (MultiVectorEncoder, ColBERT-style): its task and folder reader."""
