"""Tiny random folders laid out as BAAI/bge-m3, built offline: an XLM-RoBERTa encoder saved by `save_pretrained`, an
XLM-R-like tokenizer (Metaspace Unigram, XLM-R's special ids: <s> 0, <pad> 1, </s> 2, <unk> 3), and random
`sparse_linear.pt` (Linear(hidden, 1)) and `colbert_linear.pt` (Linear(hidden, colbert_dim)) state dicts; and what
FlagEmbedding answers for one (`reference`, run in its own venv, `.venv-flag`: `make flag-venv`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from model_store.archives import ROOT
from tests.models import TOKENIZER_WORDS

FLAG_PYTHON = ROOT / ".venv-flag" / "bin" / "python"
FLAG_SCRIPT = Path(__file__).with_name("flag_reference.py")
HIDDEN = 32
POSITIONS = 130  # XLM-R's position ids start after the padding id: 128 usable tokens


def build_tokenizer(target: Path) -> Path:
    """A small Metaspace Unigram fast tokenizer with XLM-R's special tokens and ids, trained offline."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    words = TOKENIZER_WORDS
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    raw = Tokenizer(models.Unigram())
    raw.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=160, special_tokens=specials, unk_token="<unk>"))
    raw.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", raw.token_to_id("<s>")), ("</s>", raw.token_to_id("</s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=POSITIONS - 2,
    )
    fast.save_pretrained(target)
    return target


def build_bgem3(target: Path, colbert_dim: int = HIDDEN, seed: int = 0, sentence_transformers: bool = True) -> Path:
    """A tiny random BGE-M3 folder (`colbert_dim`: the ColBERT layer's output size, FlagEmbedding's `colbert_dim`);
    with `sentence_transformers`, the sentence-transformers files BAAI/bge-m3 also ships (CLS pooling, Normalize)."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    target.mkdir(parents=True, exist_ok=True)
    build_tokenizer(target)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    torch.manual_seed(seed)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    XLMRobertaModel(config).eval().save_pretrained(target)
    sparse = torch.nn.Linear(HIDDEN, 1)
    torch.nn.init.normal_(sparse.weight, std=0.3)  # about half the tokens get a positive weight
    torch.save(sparse.state_dict(), target / "sparse_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, colbert_dim).state_dict(), target / "colbert_linear.pt")
    if sentence_transformers:
        (target / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
                ]
            )
        )
        (target / "1_Pooling").mkdir(exist_ok=True)
        (target / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": True})
        )
        (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": POSITIONS - 2}))
    (target / "README.md").write_text("a tiny random BGE-M3 folder for tests\n")  # no loader reads it
    return target


def reference(folder: Path, texts: list[str], max_length: int, colbert_dim: int = HIDDEN, **extra: Any) -> Any:
    """What FlagEmbedding's `BGEM3FlagModel(folder).encode(texts, return_dense, return_sparse, return_colbert_vecs)`
    answers, run in its own venv: {"dense": [...], "sparse": [{id: weight}], "colbert": [[[...]]], "tokens": [...]}
    (`extra`: `normalize_embeddings`, `truncate_dim`)."""
    request = {"folder": str(folder), "texts": texts, "max_length": max_length, "colbert_dim": colbert_dim, **extra}
    run = subprocess.run(
        [str(FLAG_PYTHON), str(FLAG_SCRIPT)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
