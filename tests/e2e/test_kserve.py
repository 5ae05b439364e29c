"""KServe's own Python SDK (`kserve==0.21.0`, in its own venv) against our v2 endpoint, batching on, both modes:
the binary tensor data extension (the SDK's default) and JSON (which carries `model_name`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.harness.stats import parse_prometheus
from model_store.archives import ROOT
from tests.e2e.test_serving import texts_for_load

pytestmark = pytest.mark.e2e
SDK_VENV = ROOT / ".venv-kserve"
SDK_PYTHON = SDK_VENV / "bin" / "python"
CLIENT = Path(__file__).with_name("kserve_sdk_client.py")


def sdk_results(url: str, model: str, token: str, groups: list[list[str]], *args: str) -> list[dict]:
    """What `kserve_sdk_client.py` (in the SDK's venv) got back for each group, sent concurrently: `args` are its
    mode and, optionally, a precision."""
    run = subprocess.run(
        [str(SDK_PYTHON), str(CLIENT), url, model, token, *args],
        input=json.dumps(groups),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sdk_venv() -> None:
    if not (SDK_VENV / ".installed").exists():
        pytest.skip("the KServe SDK's venv is missing: run `make kserve-venv` (CI does)")


@pytest.fixture(scope="module")
def v2_model(sdk_venv, torchserve, scheduled):
    """The session's TorchServe, serving the model `scheduled` (batch_size 8, max_batch_delay 100, one worker)."""
    return torchserve


@pytest.mark.parametrize("mode", ["binary", "json"])
def test_kserve_sdk_v2_client(v2_model, scheduled, reference, mode):
    groups = [texts_for_load(n, seed=20 + n) for n in (3, 1, 4, 2, 3, 5)]
    token = v2_model.client.keys.key("inference")
    before = parse_prometheus(v2_model.client.metrics(), scheduled)
    results = sdk_results(v2_model.endpoints.inference, scheduled, token, groups, mode)
    for i, (group, result) in enumerate(zip(groups, results, strict=True)):
        assert result["id"] == f"sdk-{i}" and result["model_name"] == scheduled
        vectors = np.asarray(result["outputs"]["embedding"])
        assert vectors.shape == (len(group), 384)
        for text, vector in zip(group, vectors, strict=True):
            assert np.max(np.abs(vector - reference(text))) <= 1e-5
    after = parse_prometheus(v2_model.client.metrics(), scheduled)
    requests = after["bucket_requests_total"] - before["bucket_requests_total"]
    assert requests == len(groups)
    if scheduled == "batch":  # continuous: calls are slices, not batches
        assert after["bucket_batches_total"] - before["bucket_batches_total"] < requests


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
def test_kserve_sdk_v2_packed_precision(v2_model, scheduled, reference, precision):
    """`parameters.precision` through the SDK's binary data extension: an INT8/UINT8 tensor whose rows equal
    `quantize_embeddings` of sentence-transformers' embedding (every bit whose float is not within 1e-5 of zero)."""
    from sentence_transformers.util.quantization import quantize_embeddings

    groups = [texts_for_load(n, seed=40 + n) for n in (2, 3)]
    token = v2_model.client.keys.key("inference")
    results = sdk_results(v2_model.endpoints.inference, scheduled, token, groups, "binary", precision)
    for group, result in zip(groups, results, strict=True):
        assert result["datatypes"]["embedding"] == ("INT8" if precision == "binary" else "UINT8")
        floats = np.stack([reference(text) for text in group])
        packed = np.asarray(quantize_embeddings(floats, precision))
        got = np.asarray(result["outputs"]["embedding"]).astype(packed.dtype)
        assert got.shape == packed.shape == (len(group), 48)
        differ = np.unpackbits((got ^ packed).astype(np.uint8), axis=-1)
        assert int(np.count_nonzero(differ & ~(np.abs(floats) <= 1e-5))) == 0
