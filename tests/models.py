"""Model directories for tests: tiny random BERTs built offline (the real MiniLM is `archives.minilm_dir()`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from model_store.archives import copy_minilm_tokenizer

if TYPE_CHECKING:
    from transformers import BertConfig

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
ProblemType = Literal["regression", "single_label_classification", "multi_label_classification"]


def tiny_bert_config(**extra: Any) -> BertConfig:
    """The tiny BERT geometry of the test models (2 layers, hidden 32, 2 heads, MiniLM's 30522-id vocabulary), with
    `extra` config fields (labels, problem_type)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        **extra,
    )


def build_tiny_bert(
    target: Path,
    classifier: bool,
    seed: int = 0,
    labels: dict[int, str] = LABELS,
    problem_type: ProblemType | None = None,
) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's tokenizer, saved like a hub checkpoint."""
    import torch
    from transformers import BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    config = tiny_bert_config(
        id2label=labels,  # num_labels follows
        label2id={v: k for k, v in labels.items()},
        problem_type=problem_type,
    )
    model = BertForSequenceClassification(config) if classifier else BertModel(config)
    model.eval().save_pretrained(target)
    return copy_minilm_tokenizer(target)


TOKENIZER_WORDS = [
    "serving",
    "transformer",
    "a",
    "unbelievably",
    "x",
    "caf\u00e9",
    "\u6f22\u5b57",
    "(note)",
    "don't",
    "--",
    "\u200b",
    "\x00",
    "\U0001f600",
    "1234567",
    "https://example.org/a?b=c",
    "\t",
    "\n",
    "Zwölf",
    "short",
    "queries",
    "and",
    "long",
    "documents",
    "served",
    "together",
]


# Llama-3's (and GPT-4's cl100k) split regex: digits grouped by three from the left of each run.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer(target: Path, kind: str) -> Path:
    """A small byte-level BPE (RoBERTa-like; `llama3`: split first by Llama-3's regex) or Metaspace Unigram
    (XLM-R-like) fast tokenizer, trained offline."""
    from tokenizers import Regex, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as Raw
    from transformers import PreTrainedTokenizerFast

    words = TOKENIZER_WORDS
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    specials = ["<s>", "</s>", "<pad>", "<unk>"]
    if kind in ("bpe", "llama3"):
        raw = Raw(models.BPE(unk_token="<unk>"))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if kind == "llama3":
            split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated")
            raw.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(False, use_regex=False)])
        trainer: trainers.Trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        raw = Raw(models.Unigram())
        raw.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>")
    raw.train_from_iterator(corpus, trainer)
    raw.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", raw.token_to_id("<s>")), ("</s>", raw.token_to_id("</s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(target)
    return target


def build_tiny(
    target: Path, arch: str, classifier: bool = False, seed: int = 0, labels_by_id: dict[int, str] = LABELS
) -> Path:
    """A randomly initialised tiny encoder of a family: bert, roberta (byte-level BPE) or distilbert."""
    if arch == "bert":
        return build_tiny_bert(target, classifier, seed, labels=labels_by_id)
    import torch
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        DistilBertConfig,
        PretrainedConfig,
        RobertaConfig,
    )

    torch.manual_seed(seed)
    target.mkdir(parents=True, exist_ok=True)
    labels: dict[str, Any] = {  # num_labels follows id2label
        "id2label": labels_by_id,
        "label2id": {v: k for k, v in labels_by_id.items()},
    }
    if arch == "roberta":
        build_tokenizer(target, "bpe")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target)
        config: PretrainedConfig = RobertaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=130,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            **labels,
        )
    elif arch == "distilbert":
        copy_minilm_tokenizer(target)
        config = DistilBertConfig(
            vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=256, **labels
        )
    else:
        raise ValueError(f"unknown arch {arch!r}")
    auto = AutoModelForSequenceClassification if classifier else AutoModel
    auto.from_config(config).eval().save_pretrained(target)
    return target


def build_sentence_transformer(
    target: Path,
    arch: str = "bert",
    pooling: str | tuple[str, ...] = "mean",
    dense: tuple[tuple[int, bool, str], ...] = (),
    normalize: bool = False,
    include_prompt: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
    max_seq_length: int | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random encoder saved by sentence-transformers itself: `SentenceTransformer(modules=[...]).save()`.

    `dense`: (out_features, bias, torch.nn activation class name) per Dense module, in order."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    body = build_tiny(target.parent / f"{target.name}-body", arch, seed=seed)
    torch.manual_seed(seed + 1)
    transformer = Transformer(str(body), max_seq_length=max_seq_length)
    width = transformer.get_embedding_dimension()
    modules: list = [transformer, Pooling(width, pooling_mode=pooling, include_prompt=include_prompt)]
    width *= 1 if isinstance(pooling, str) else len(pooling)
    for out, bias, activation in dense:
        modules.append(Dense(width, out, bias=bias, activation_function=getattr(torch.nn, activation)()))
        width = out
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt)
    model.save(str(target))
    return target


def build_cross_encoder(
    target: Path,
    arch: str = "bert",
    labels: int = 1,
    seed: int = 0,
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
) -> Path:
    """A tiny random cross-encoder saved by sentence-transformers itself (`CrossEncoder(body).save()`)."""
    from sentence_transformers import CrossEncoder

    names = {i: f"LABEL_{i}" for i in range(labels)}
    body = build_tiny(target.parent / f"{target.name}-body", arch, classifier=True, seed=seed, labels_by_id=names)
    model = CrossEncoder(str(body), device="cpu", prompts=prompts, default_prompt_name=default_prompt)
    model.save(str(target))
    return target


def build_gemma3(target: Path, window: int = 8, seed: int = 0) -> Path:
    """A tiny random EmbeddingGemma-style model saved by sentence-transformers: a Gemma3 text body with
    bidirectional attention and a sliding window of `window` tokens, mean pooling, two Dense layers, Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoModel, AutoTokenizer, Gemma3TextConfig

    body = build_tokenizer(target.parent / f"{target.name}-body", "bpe")
    tok = AutoTokenizer.from_pretrained(body)
    config = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    AutoModel.from_config(config).eval().save_pretrained(body)
    transformer = Transformer(str(body))
    width = transformer.get_embedding_dimension()
    dense = [
        Dense(width, 48, bias=False, activation_function=torch.nn.Identity()),
        Dense(48, 24, bias=False, activation_function=torch.nn.Identity()),
    ]
    SentenceTransformer(modules=[transformer, Pooling(width, pooling_mode="mean"), *dense, Normalize()]).save(
        str(target)
    )
    return target


def build_multi_vector_encoder(
    target: Path,
    dense: tuple[tuple[int, bool, str], ...] = (),
    normalize: bool = True,
    skiplist: tuple[str, ...] = (),
    skiplist_tasks: tuple[str, ...] = ("document",),
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
    max_seq_length: int | None = 64,
    query_length: int | None = None,
    document_length: int | None = None,
    expansion: dict | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random multi-vector (ColBERT-style) encoder saved by sentence-transformers itself:
    `MultiVectorEncoder(modules=[Transformer, Dense..., MultiVectorMask, Normalize?]).save()`.

    `dense`: (out_features, bias, torch.nn activation class name) per Dense over the token embeddings;
    `expansion`: the Transformer's `query_expansion` ({"strategy", "attend", "length", "token"?})."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    body = build_tiny(target.parent / f"{target.name}-body", "bert", seed=seed)
    torch.manual_seed(seed + 1)
    transformer = Transformer(
        str(body),
        max_seq_length=max_seq_length,
        query_length=query_length,
        document_length=document_length,
        query_expansion=expansion,
    )
    width = transformer.get_embedding_dimension()
    modules: list = [transformer]
    for out, bias, activation in dense:
        layer = Dense(
            width,
            out,
            bias=bias,
            activation_function=getattr(torch.nn, activation)(),
            module_input_name="token_embeddings",
            module_output_name="token_embeddings",
        )
        modules.append(layer)
        width = out
    modules.append(MultiVectorMask(skiplist_words=list(skiplist), skiplist_tasks=list(skiplist_tasks)))
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    model = MultiVectorEncoder(modules=modules, prompts=prompts, default_prompt_name=default_prompt)
    model.save(str(target))
    return target


def build_sparse_encoder(
    target: Path,
    pooling: Literal["max", "sum"] = "max",
    activation: Literal["relu", "log1p_relu"] = "relu",
    router: bool = False,
    prompts: dict[str, str] | None = None,
    max_active_dims: int | None = None,
    seed: int = 0,
    legacy: bool = True,
    logit_scale: float = 1.0,
) -> Path:
    """A tiny random SparseEncoder saved by sentence-transformers itself: SPLADE (a 2-layer BERT masked-LM with
    MiniLM's tokenizer in an `MLMTransformer`, or with `legacy` False a `Transformer` with transformer_task
    fill-mask, then SpladePooling; its logits `logit_scale` times the random model's), or (`router`) a Router with a
    SparseStaticEmbedding query route and that SPLADE document route."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SparseStaticEmbedding, SpladePooling
    from transformers import BertForMaskedLM

    torch.manual_seed(seed)
    body = target.parent / f"{target.name}-body"
    mlm_model = BertForMaskedLM(tiny_bert_config()).eval()
    with torch.no_grad():  # the decoder is tied to the embeddings: scale what feeds it, and its bias
        head = mlm_model.cls.predictions
        for weight in (head.transform.LayerNorm.weight, head.transform.LayerNorm.bias, head.bias):
            weight.mul_(logit_scale)
    mlm_model.save_pretrained(body)
    copy_minilm_tokenizer(body)
    if legacy:
        mlm = MLMTransformer(str(body), max_seq_length=128)
    else:
        mlm = Transformer(str(body), max_seq_length=128, transformer_task="fill-mask")
    splade = [mlm, SpladePooling(pooling, activation_function=activation)]
    if router:
        weight = torch.rand(30522) * (torch.rand(30522) > 0.3)  # some ids weigh nothing
        static = SparseStaticEmbedding(tokenizer=cast(Any, mlm.tokenizer), weight=weight, frozen=True)
        modules: list = [Router.for_query_document([static], splade)]
    else:
        modules = splade
    model = SparseEncoder(modules=modules, prompts=prompts, max_active_dims=max_active_dims, device="cpu")
    model.save(str(target))
    return target
