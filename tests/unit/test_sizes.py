"""The sizes that must agree (`bucketing.sizes`): texts per request, the largest answer, TorchServe's caps in every
shipped config.properties, and the passes of `dynamic`/`static` bounded whatever the request."""

from __future__ import annotations

import pytest

from bucketing import protocols, sizes
from bucketing.config import HandlerConfig
from bucketing.planning.planner import plan_dynamic, plan_static
from bucketing.protocols.base import Limits
from model_store.archives import ROOT
from tsctl import read_properties


def test_the_defaults_are_derived_from_one_source():
    config = HandlerConfig()
    assert config.max_texts_per_request == sizes.MAX_TEXTS == 2048  # OpenAI's limit
    assert config.max_response_bytes == sizes.RESPONSE_BYTES == sizes.embeddings_bytes(2048, sizes.WIDEST)
    assert sizes.texts_that_fit(sizes.RESPONSE_BYTES, sizes.WIDEST) == sizes.MAX_TEXTS
    assert sizes.texts_that_fit(sizes.RESPONSE_BYTES, 384) > sizes.MAX_TEXTS  # MiniLM, with room


@pytest.mark.parametrize("path", ["config/config.properties", "config/kserve/config.properties"])
def test_torchserve_caps_in_each_shipped_config_are_the_derived_ones(path):
    props = read_properties(ROOT / path)
    assert {k: props.get(k) for k in sizes.torchserve_properties()} == sizes.torchserve_properties()
    assert int(props["max_response_size"]) == HandlerConfig().max_response_bytes  # kept equal


@pytest.mark.parametrize("dimensions", [32, 384, 768, 1024])
def test_a_full_request_of_float_answers_fits_the_default_cap_up_to_the_widest(dimensions):
    limits = Limits(max_texts=sizes.MAX_TEXTS, max_length=256, vocab_size=30522, dimensions=dimensions)
    assert protocols.largest_answer(limits) <= sizes.RESPONSE_BYTES


def test_a_request_of_typical_texts_fits_the_request_cap():
    text = "a passage about serving transformer encoders, " * 50  # about 2.3 KB, 450 tokens
    body = ('{"input": [' + ", ".join([f'"{text}"'] * sizes.MAX_TEXTS) + '], "model": "m"}').encode()
    assert len(body) <= sizes.REQUEST_BYTES


def test_dynamic_and_static_cut_an_oversized_batch_into_bounded_passes_in_arrival_order():
    lengths = [3, 256, 17] * 1000  # 3,000 texts: one pass would hold 768,000 padded tokens
    for plan in (plan_dynamic(lengths), plan_static(lengths, 256)):
        assert all(sb.padded_tokens <= sizes.UNSPLIT_TOKENS for sb in plan.sub_batches)
        assert [i for sb in plan.sub_batches for i in sb.indices] == list(range(len(lengths)))
        assert len(plan.sub_batches) == 6  # 512 rows of 256 tokens a pass
    small = [3, 256, 17] * 100  # within the bound: one pass, as before
    assert len(plan_dynamic(small).sub_batches) == len(plan_static(small, 256).sub_batches) == 1
    assert [sb.padded_len for sb in plan_dynamic([5] * 600 + [9] * 10, max_pass_tokens=90).sub_batches][-2:] == [5, 9]
