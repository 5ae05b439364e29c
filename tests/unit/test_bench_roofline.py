"""bench.harness.roofline: FLOPs per real token of an encoder, from its config.json (a masked LM adds its head)."""

from __future__ import annotations

import json

from bench.harness.roofline import flops_per_token, roofline_tokens_per_s


def test_flops_per_token_counts_the_mlm_head_of_a_masked_lm(tmp_path):
    cfg = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2, "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    encoder = 2 * (2 * (4 * 16 + 2 * 4 * 8) + 4 * 3 * 4)  # two layers at mean length 3
    assert flops_per_token(tmp_path, 3) == encoder == 608
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    assert flops_per_token(tmp_path, 3) == encoder + 2 * (4 * 4 + 4 * 10)  # transform d x d, decoder d x vocab
    assert roofline_tokens_per_s(tmp_path, 3, 2, 720.0) == 2.0
