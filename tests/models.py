"""Model directories for tests: tiny random BERTs built offline (the real MiniLM is `archives.minilm_dir()`)."""

from __future__ import annotations

from pathlib import Path

from model_store.archives import minilm_dir

LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def build_tiny_bert(target: Path, classifier: bool, seed: int = 0) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's tokenizer, saved like a hub checkpoint."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    source = minilm_dir()
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )
    model = BertForSequenceClassification(config) if classifier else BertModel(config)
    model.eval().save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    return target
