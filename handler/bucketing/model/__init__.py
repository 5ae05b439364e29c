"""The model as read from its folder: the sentence-transformers module chain, the torch head over the encoder
(pooling, Dense), the tokenizer (one pass, exact cuts) and its normalizers."""
