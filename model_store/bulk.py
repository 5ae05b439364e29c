"""The bulk registration (`make serve-bulk`, `tsctl start --bulk`, `build --bulk`): one worker on both cores, so one
bulk request runs on both (TorchServe answers a delivered batch as a whole, on one worker), with a responseTimeout
sized for the bulk requests it exists for: docs/api/bulk.md."""

from __future__ import annotations

from pathlib import Path

from model_store.archives import TEMPLATE, served

BULK_WORKERS, BULK_THREADS = 1, 2


def bulk_response_timeout_s(template: Path = TEMPLATE) -> int:
    """The bulk registration's responseTimeout: the request `max_request_size` is sized for (`sizes.MAX_TEXTS`
    texts at the template's max_length: 2,048 x 256 = 524k tokens) at the template's cost model (230 us a padded
    token: 121 s of passes), over the share of responseTimeout a call starts passes in (75%), twice over for a slower
    or busier CPU, in whole half-minutes: 330 s."""
    from bucketing.serving.deadline import DEADLINE_SHARE
    from bucketing.sizes import MAX_TEXTS

    config = served(template)
    passes = MAX_TEXTS * config.max_length * config.cost.per_token_us / 1e6
    return int(-(-2 * passes / DEADLINE_SHARE // 30) * 30)
