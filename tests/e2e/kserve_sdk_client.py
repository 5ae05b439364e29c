"""Run by test_kserve.py and test_kserve_image.py with the KServe SDK's own venv: concurrent inferences through
`InferenceRESTClient`, as a new user would write them (v2 binary or JSON, optionally in a packed precision, or
v1); prints what came back as JSON. Not collected by pytest."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def infer(
    client, url: str, model: str, token: str, texts: list[str], binary: bool, rid: str, precision: str | None
) -> dict:
    tensor = InferInput(name="text", shape=[len(texts)], datatype="BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=np.object_), binary_data=binary)
    parameters = ({"binary_data_output": True} if binary else {}) | ({"precision": precision} if precision else {})
    request = InferRequest(model_name=model, infer_inputs=[tensor], request_id=rid, parameters=parameters or None)
    response = await client.infer(url, request, model_name=model, headers={"Authorization": f"Bearer {token}"})
    return {
        "id": response.id,
        "model_name": response.model_name,
        "outputs": {o.name: o.as_numpy().tolist() for o in response.outputs},
        "datatypes": {o.name: o.datatype for o in response.outputs},
    }


async def infer_v1(client, url: str, model: str, token: str, texts: list[str]) -> dict:
    response = await client.infer(
        url, {"instances": texts}, model_name=model, headers={"Authorization": f"Bearer {token}"}
    )
    return {"outputs": {"embedding": [p["embedding"] for p in response["predictions"]]}}


async def main(url: str, model: str, token: str, mode: str, groups: list[list[str]], precision: str | None) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v1" if mode == "v1" else "v2", timeout=60))
    try:
        if mode == "v1":
            calls = [infer_v1(client, url, model, token, g) for g in groups]
        else:
            calls = [
                infer(client, url, model, token, g, mode == "binary", f"sdk-{i}", precision)
                for i, g in enumerate(groups)
            ]
        results = await asyncio.gather(*calls)
    finally:
        await client.close()
    print(json.dumps(results))


if __name__ == "__main__":
    url, model, token, mode = sys.argv[1:5]
    precision = sys.argv[5] if len(sys.argv) > 5 else None  # a v2 request's `parameters.precision`
    asyncio.run(main(url, model, token, mode, json.loads(sys.stdin.read()), precision))
