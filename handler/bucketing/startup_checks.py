"""Start-up checks of a worker's settings against the loaded model (a ConfigError in one line when they do not fit):
the prompts a request may name, max_length against the model's own limits, and the largest answer against the cap.
"""

from __future__ import annotations

from bucketing import protocols
from bucketing.config import ConfigError, HandlerConfig
from bucketing.kinds.task import Task
from bucketing.model.chain import Chain, sentence_transformers_limit
from bucketing.model.tokenizer import Tokenizer
from bucketing.model_kinds import MODEL_KINDS
from bucketing.planning.planner import round_up
from bucketing.protocols.base import Limits


def model_prompts(config: HandlerConfig, chain: Chain | None) -> tuple[dict[str, str], str | None]:
    """The prompts a request may name: the model's own (config_sentence_transformers.json), then those the
    model-config adds (`handler.prompts`); and the default one's name (the model-config's, else the model's)."""
    prompts = {**(dict(chain.prompts) if chain is not None else {}), **dict(config.prompts)}
    default = config.default_prompt_name or (chain.default_prompt_name if chain is not None else None)
    if default and default not in prompts:
        raise ConfigError(
            f"handler.default_prompt_name: got {default!r}; allowed: one of the model's prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return prompts, default or None


def check_fits(config: HandlerConfig, task: Task, tokenizer: Tokenizer, limits: Limits) -> int:
    """Start-up checks that need the loaded model: its positions, and the largest answer against the cap. Returns
    the model's own limit in tokens (where sentence-transformers cuts its texts)."""
    chain = task.chain
    if chain is not None and chain.max_seq_length and config.max_length > chain.max_seq_length:
        raise ConfigError(
            f"handler.max_length: got {config.max_length}; allowed: at most the model's max_seq_length "
            f"({chain.max_seq_length}, sentence_bert_config.json), where sentence-transformers cuts its texts"
        )
    if config.max_length > task.max_positions:
        raise ConfigError(
            f"handler.max_length: got {config.max_length}; allowed: at most the model's "
            f"max_position_embeddings ({task.max_positions})"
        )
    max_seq_length = chain.max_seq_length if chain is not None else None
    model_limit = sentence_transformers_limit(max_seq_length, tokenizer.model_max_length, task.max_positions)
    if config.max_length > model_limit:
        raise ConfigError(
            f"handler.max_length: got {config.max_length}; allowed: at most the model's own limit "
            f"({model_limit}, its tokenizer's model_max_length), where sentence-transformers cuts its texts"
        )
    padded = round_up(config.max_length, config.pad_to_multiple_of)
    if not config.planning.pads_to_max_length and padded > task.max_positions:
        raise ConfigError(
            f"handler.pad_to_multiple_of: got {config.pad_to_multiple_of} with handler.max_length "
            f"{config.max_length}: a text of {config.max_length} tokens would be padded to {padded}, past the "
            f"model's {task.max_positions} positions; allowed: a multiple that rounds max_length to at "
            f"most {task.max_positions} (or a smaller max_length)"
        )
    longer = {k: v for k, v in task.input_lengths().items() if v > model_limit}
    if longer:
        raise ConfigError(
            f"the model's {', '.join(f'{k} {v}' for k, v in longer.items())} exceeds its own limit of "
            f"{model_limit} tokens (max_seq_length), where this handler tokenizes its texts; not served"
        )
    check_answer_size(config, task, limits)
    return model_limit


def check_answer_size(config: HandlerConfig, task: Task, limits: Limits) -> None:
    """The largest answer (one text, or a full request) must fit handler.max_response_bytes."""
    largest = protocols.largest_answer(limits, task.labels)
    kind = MODEL_KINDS[task.name]
    if largest > config.max_response_bytes and kind.answer_bound == "one_text":
        raise ConfigError(
            f"handler.max_response_bytes: got {config.max_response_bytes}; allowed: at least {largest}, the "
            f"answer to one text of max_length {config.max_length} tokens of this {kind.title} model"
        )
    if largest > config.max_response_bytes:
        per_text = largest // config.max_texts_per_request
        raise ConfigError(
            f"handler.max_texts_per_request: got {config.max_texts_per_request}; allowed: at most "
            f"{config.max_response_bytes // per_text} for this model, so that an answer (up to {per_text} bytes "
            f"a text) fits handler.max_response_bytes ({config.max_response_bytes}, TorchServe's "
            "max_response_size)"
        )
