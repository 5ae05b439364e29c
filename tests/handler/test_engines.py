"""Engines: ONNX Runtime and OpenVINO give the torch model's answers (checked at start-up, a mismatch stops the
worker), device and dtype selection (bfloat16 on a CPU that multiplies it natively, its fidelity measured; on
OpenVINO where it runs bf16)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bucketing.config import ConfigError, HandlerConfig
from bucketing.engines import check_dtype, select_device
from bucketing.engines.onnx_engine import ONNX_FILE
from bucketing.engines.torch_engine import TorchEngine
from bucketing.model.head import EngineError
from model_store.archives import engine_model_dir
from tests.handler.test_handler import STRATEGIES, alone, make_handler, mixed_texts, serve


@pytest.fixture(scope="module")
def onnx_dirs(tiny_embedder_dir, tiny_classifier_dir, tmp_path_factory):
    return {
        task: engine_model_dir(folder, "onnxruntime", task, tmp_path_factory.mktemp(f"onnx-{task}"))
        for task, folder in (("embedding", tiny_embedder_dir), ("classification", tiny_classifier_dir))
    }


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_onnxruntime_embeddings_match_torch_and_batch_of_one(onnx_dirs, tiny_embedder_dir, strategy):
    ort, context = make_handler(onnx_dirs["embedding"], engine="onnxruntime", strategy=strategy, max_length=128)
    torch_handler, _ = make_handler(tiny_embedder_dir, strategy=strategy, max_length=128)
    assert ort.task.engine.name == "onnxruntime" and ort.task.engine.device == "cpu"
    texts = mixed_texts(10, seed=7)
    answers = serve(ort, context, [{"body": {"texts": texts}}])[0][1]
    for text, answer in zip(texts, answers, strict=True):
        vector = np.array(answer["embedding"])
        assert np.max(np.abs(vector - np.array(alone(ort, context, text)["embedding"]))) <= 1e-5
        assert np.max(np.abs(vector - np.array(alone(torch_handler, context, text)["embedding"]))) <= 1e-5


def test_onnxruntime_classification_gives_the_same_labels(onnx_dirs, tiny_classifier_dir):
    ort, context = make_handler(onnx_dirs["classification"], engine="onnxruntime", task="classification")
    torch_handler, _ = make_handler(tiny_classifier_dir, task="classification")
    texts = mixed_texts(8, seed=8)
    a = serve(ort, context, [{"body": {"texts": texts}}])[0][1]
    b = serve(torch_handler, context, [{"body": {"texts": texts}}])[0][1]
    for x, y in zip(a, b, strict=True):
        assert x["label"] == y["label"]
        assert max(abs(x["scores"][k] - y["scores"][k]) for k in x["scores"]) <= 1e-5


def test_a_missing_or_foreign_graph_stops_the_worker(onnx_dirs, tiny_embedder_dir, tmp_path):
    with pytest.raises(EngineError, match="no model.onnx"):
        make_handler(tiny_embedder_dir, engine="onnxruntime")
    foreign = tmp_path / "foreign"
    shutil.copytree(onnx_dirs["embedding"], foreign, symlinks=False)
    from tests.models import build_tiny_bert

    other = build_tiny_bert(tmp_path / "other", classifier=False, seed=1)
    shutil.copy(other / "model.safetensors", foreign / "model.safetensors")  # weights no longer match the graph
    with pytest.raises(EngineError, match="differs from the torch model"):
        make_handler(foreign, engine="onnxruntime")


def test_openvino_embeddings_and_labels_match_torch(onnx_dirs, tiny_embedder_dir, tiny_classifier_dir):
    """The openvino engine runs the graph onnxruntime's archive carries, compiled in f32 (always stated: OpenVINO
    picks bf16 by itself on a bf16 CPU), with the worker's threads and one stream."""
    ov, context = make_handler(onnx_dirs["embedding"], engine="openvino", max_length=128)
    torch_handler, _ = make_handler(tiny_embedder_dir, max_length=128)
    engine = ov.task.engine
    assert (engine.name, engine.device, engine.precision, engine.fidelity) == ("openvino", "cpu", "f32", None)
    assert engine.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert engine.compiled.get_property("NUM_STREAMS") == 1
    assert set(engine.runtime_precisions()) == {"f32"}
    texts = mixed_texts(10, seed=7)
    answers = serve(ov, context, [{"body": {"texts": texts}}])[0][1]
    for text, answer in zip(texts, answers, strict=True):
        vector = np.array(answer["embedding"])
        assert np.max(np.abs(vector - np.array(alone(ov, context, text)["embedding"]))) <= 1e-5
        assert np.max(np.abs(vector - np.array(alone(torch_handler, context, text)["embedding"]))) <= 1e-5
    ov, context = make_handler(onnx_dirs["classification"], engine="openvino", task="classification")
    torch_handler, _ = make_handler(tiny_classifier_dir, task="classification")
    a = serve(ov, context, [{"body": {"texts": texts}}])[0][1]
    b = serve(torch_handler, context, [{"body": {"texts": texts}}])[0][1]
    for x, y in zip(a, b, strict=True):
        assert x["label"] == y["label"]
        assert max(abs(x["scores"][k] - y["scores"][k]) for k in x["scores"]) <= 1e-5


def test_openvino_without_a_graph_names_the_build_command(tiny_embedder_dir):
    with pytest.raises(EngineError, match=r"handler.engine openvino: no model.onnx .*--engine openvino"):
        make_handler(tiny_embedder_dir, engine="openvino")


def test_openvino_bfloat16_goes_through_the_fidelity_gate(onnx_dirs, openvino_bf16):
    """bfloat16 on openvino (where OpenVINO runs its matrix products in bf16): measured against float32 torch on the
    probe set, stated on the ready line, refused in one line under min_cosine."""
    handler, _ = make_handler(onnx_dirs["embedding"], engine="openvino", dtype="bfloat16", max_length=128)
    engine = handler.task.engine
    assert engine.precision == "bf16" and engine.runtime_precisions()["bf16"] > 0
    assert engine.fidelity.dtype == "bfloat16" and engine.fidelity.cosine_min >= 0.999
    assert "bfloat16 fidelity vs float32" in handler.worker.ready_line()
    with pytest.raises(EngineError, match="below handler.min_cosine 1") as raised:
        make_handler(onnx_dirs["embedding"], engine="openvino", dtype="bfloat16", min_cosine=1.0)
    assert "\n" not in str(raised.value)
    sampled, context = make_handler(onnx_dirs["embedding"], engine="openvino", dtype="bfloat16", fidelity_sample=1.0)
    assert serve(sampled, context, [{"body": {"texts": mixed_texts(4, seed=3)}}])[0][0] == 200
    assert sampled.task.engine.shadow.minimum >= 0.999


def test_device_follows_torchserve_gpu_id_when_cuda_is_there():
    assert select_device(None, True) == "cpu"
    assert select_device(0, False) == "cpu"
    assert select_device(1, True) == "cuda:1" and select_device("0", True) == "cuda:0"


def test_a_worker_given_a_gpu_without_cuda_runs_on_the_cpu(tiny_embedder_dir, monkeypatch):
    seen = []
    import bucketing.engines as engines

    real = engines.select_device

    def spy(gpu_id, cuda):
        seen.append((gpu_id, cuda))
        return real(gpu_id, cuda)

    monkeypatch.setattr(engines, "select_device", spy)
    handler, context = make_handler(tiny_embedder_dir)  # LocalContext: gpu_id None
    context.system_properties["gpu_id"] = 0  # what TorchServe sets on a GPU host
    handler.initialize(context)
    cuda = __import__("torch").cuda.is_available()
    assert seen == [(None, cuda), (0, cuda)] and handler.task.engine.device == ("cuda:0" if cuda else "cpu")


def test_half_precision_is_for_cuda_and_torch():
    with pytest.raises(ConfigError, match="handler.dtype: got 'float16' on the CPU"):
        check_dtype(HandlerConfig(dtype="float16"), "cpu")
    with pytest.raises(ConfigError, match="engine onnxruntime"):
        check_dtype(HandlerConfig(dtype="bfloat16", engine="onnxruntime"), "cuda:0")
    with pytest.raises(ConfigError, match="the openvino engine runs float32 or bfloat16 only"):
        check_dtype(HandlerConfig(dtype="float16", engine="openvino"), "cuda:0")
    assert str(check_dtype(HandlerConfig(dtype="bfloat16"), "cuda:0")) == "torch.bfloat16"
    assert ONNX_FILE == "model.onnx"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA GPU here (bench/gpu_check.sh)")
@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_cuda_worker_matches_the_cpu(onnx_dirs, engine):
    cpu, context = make_handler(onnx_dirs["embedding"], engine=engine)
    context.system_properties["gpu_id"] = 0
    gpu = type(cpu)()
    gpu.initialize(context)
    assert gpu.task.engine.device == "cuda:0"
    texts = mixed_texts(6, seed=9)
    for a, b in zip(
        serve(cpu, context, [{"body": {"texts": texts}}])[0][1],
        serve(gpu, context, [{"body": {"texts": texts}}])[0][1],
        strict=True,
    ):
        assert np.max(np.abs(np.array(a["embedding"]) - np.array(b["embedding"]))) <= 1e-4


def openai(handler, context, bodies):
    """Answers to OpenAI embeddings bodies, served in one delivered batch."""
    context.with_requests(["application/json"] * len(bodies), ["v1/embeddings"] * len(bodies))
    replies = handler.handle([{"body": b} for b in bodies], context)
    return [(context.status[i][0], json.loads(r)) for i, r in enumerate(replies)]


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
def test_token_ids_cut_either_side_as_their_text_and_the_kept_ids_are_checked(onnx_dirs, tiny_embedder_dir, engine):
    """Ids over max_length keep the ids the text's own cut keeps (the last ones with `truncation_direction: left`),
    and every kept id is checked: -1 or 10**6 there is the client's 400, never a 500 or ONNX's wrapped index."""
    from transformers import AutoTokenizer

    folder = tiny_embedder_dir if engine == "torch" else onnx_dirs["embedding"]
    handler, context = make_handler(folder, engine=engine, max_length=32)
    text = " ".join(mixed_texts(12, seed=9))
    ids = AutoTokenizer.from_pretrained(tiny_embedder_dir)(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 3 * 32
    vocab = handler.tokenizer.vocab_size
    bodies = []
    for side in ("right", "left"):
        bodies += [{"input": text, "truncation_direction": side}, {"input": ids, "truncation_direction": side}]
    bodies.append({"input": ids[:32] + [-1] + ids[33:], "truncation_direction": "left"})  # -1 cut away on the left
    (text_right, ids_right, text_left, ids_left, cut_away) = openai(handler, context, bodies)
    for by_text, by_ids in ((text_right, ids_right), (text_left, ids_left), (text_left, cut_away)):
        assert by_text[0] == by_ids[0] == 200, (by_text, by_ids)
        got, expected = (np.array(b["data"][0]["embedding"]) for b in (by_ids[1], by_text[1]))
        assert np.max(np.abs(got - expected)) <= 1e-5
    assert np.max(np.abs(np.array(text_left[1]["data"][0]["embedding"]) - text_right[1]["data"][0]["embedding"])) > 0.01
    for side, index, bad_id in (("left", -1, -1), ("left", -30, 10**6), ("right", 0, -1), ("right", 29, vocab)):
        wrong = list(ids)
        wrong[index] = bad_id
        ((status, body),) = openai(handler, context, [{"input": wrong, "truncation_direction": side}])
        assert status == 400 and f"= {bad_id} is not a token id" in body["error"]["message"], (side, body)
        assert f"input[{index % len(ids)}]" in body["error"]["message"]


def test_bfloat16_is_refused_on_a_cpu_that_would_emulate_it(tiny_embedder_dir, monkeypatch):
    import bucketing.engines.precision

    monkeypatch.setattr(bucketing.engines.precision, "cpu_info", lambda: "flags\t\t: fpu sse4_2 avx avx2 fma\n")
    with pytest.raises(ConfigError, match="without native bfloat16 .* it would emulate it, slower than float32"):
        make_handler(tiny_embedder_dir, dtype="bfloat16")


def cosine_rows(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_bfloat16_embeddings_state_their_fidelity(tiny_embedder_dir, bf16_cpu, caplog):
    with caplog.at_level("INFO"):
        bf16, context = make_handler(tiny_embedder_dir, dtype="bfloat16", max_length=128)
    f32, _ = make_handler(tiny_embedder_dir, max_length=128)
    fidelity = bf16.task.engine.fidelity
    assert fidelity is not None and isinstance(bf16.task.engine, TorchEngine)
    assert f32.task.engine.fidelity is None and fidelity.dtype == "bfloat16" and fidelity.texts == 26
    assert 0.999 <= fidelity.cosine_min <= fidelity.cosine_mean < 1.0 and 0 < fidelity.max_abs_diff < 0.05
    assert bf16.task.engine.head.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in bf16.task.engine.head.dense.parameters())
    assert fidelity.describe() in caplog.text and "bucketing handler ready" in caplog.text
    texts = mixed_texts(10, seed=11)
    v2 = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [6], "data": texts[4:]}]}
    got = serve(bf16, context, [{"body": {"texts": texts[:4]}}, {"body": v2}])  # native and KServe v2 in one batch
    vectors = [a["embedding"] for a in got[0][1]] + np.reshape(got[1][1]["outputs"][0]["data"], (6, -1)).tolist()
    expected = [a["embedding"] for a in serve(f32, context, [{"body": {"texts": texts}}])[0][1]]
    assert cosine_rows(vectors, expected).min() >= 0.999
    gauge = [value for name, value, *_ in context.metrics.added if name == "bucket_fidelity_cosine_min"]
    assert gauge and set(gauge) == {fidelity.cosine_min}


def test_bfloat16_below_min_cosine_stops_the_worker_naming_the_figure(tiny_embedder_dir, bf16_cpu):
    with pytest.raises(
        EngineError, match=r"^handler.dtype bfloat16: cosine min 0\.99\d+ \(on [a-z ]+\) to float32 on 26 probe"
    ):
        make_handler(tiny_embedder_dir, dtype="bfloat16", min_cosine=1.0)


def test_bfloat16_classification_keeps_its_labels(tiny_classifier_dir, bf16_cpu):
    bf16, context = make_handler(tiny_classifier_dir, task="classification", dtype="bfloat16")
    f32, _ = make_handler(tiny_classifier_dir, task="classification")
    fidelity = bf16.task.engine.fidelity
    assert fidelity is not None
    assert fidelity.texts == 41 and fidelity.compared == 41  # 26 probes and 15 pairs of its 16 texts
    texts = mixed_texts(8, seed=12)
    a = serve(bf16, context, [{"body": {"texts": texts}}])[0][1]
    b = serve(f32, context, [{"body": {"texts": texts}}])[0][1]
    for x, y in zip(a, b, strict=True):
        assert max(abs(x["scores"][k] - y["scores"][k]) for k in x["scores"]) <= 0.02


def test_bfloat16_on_the_cpu_is_for_the_torch_engine(bf16_cpu):
    assert check_dtype(HandlerConfig(dtype="bfloat16"), "cpu") == torch.bfloat16
    with pytest.raises(ConfigError, match="engine onnxruntime"):
        check_dtype(HandlerConfig(dtype="bfloat16", engine="onnxruntime"), "cpu")


def test_the_build_of_a_bfloat16_archive_prints_its_fidelity(tiny_embedder_dir, tmp_path, capsys):
    import yaml

    from model_store import build

    stage = tmp_path / "stage"
    common = ["--model-dir", str(tiny_embedder_dir), "--strategies", "bucketed", "--stage-dir", str(stage)]
    assert build.main([*common, "--dtype", "bfloat16", "--print-commands"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("bfloat16 fidelity vs float32")]  # the build's lines
    assert line.startswith("bfloat16 fidelity vs float32 on 26 probe texts: cosine min 0.99")
    assert "(measured at build; this CPU " in line
    handler = yaml.safe_load((stage / "minilm-bucketed.yaml").read_text())["handler"]
    assert handler["dtype"] == "bfloat16" and handler["engine"] == "torch"  # bfloat16 runs on torch
    assert build.main([*common, "--dtype", "bfloat16", "--engine", "onnxruntime", "--print-commands"]) == 2
    assert "--dtype bfloat16 runs on engine torch or openvino; got --engine onnxruntime" in capsys.readouterr().err
    config = tmp_path / "strict.yaml"
    config.write_text(yaml.safe_dump({"handler": {"engine": "torch", "dtype": "bfloat16", "min_cosine": 1.0}}))
    argv = ["--config", str(config), "--name", "strict", "--model-dir", str(tiny_embedder_dir), "--out", str(tmp_path)]
    assert build.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        "is below handler.min_cosine 1; use dtype float32, or lower min_cosine knowingly (a worker would not start)"
        in err
        and not (tmp_path / "strict.mar").exists()
    )


def test_the_build_of_a_float16_archive_says_it_is_for_a_gpu(tiny_embedder_dir, tmp_path, capsys):
    """float16 is measured on this CPU at build but served only on a CUDA GPU: its line names float16, not bfloat16."""
    from model_store import build

    argv = ["--model-dir", str(tiny_embedder_dir), "--strategies", "bucketed", "--stage-dir", str(tmp_path / "stage")]
    assert build.main([*argv, "--dtype", "float16", "--print-commands"]) == 0
    (first,) = [x for x in capsys.readouterr().out.splitlines() if "fidelity vs float32" in x]
    assert first.startswith("float16 fidelity vs float32 on 26 probe texts: cosine min ")
    assert "bfloat16" not in first and "float16 is served on a CUDA GPU only" in first, first


def test_the_openvino_build_checks_the_graph_on_openvino(tiny_embedder_dir, tmp_path, monkeypatch, capsys):
    """`--engine openvino` stages onnxruntime's graph, checked on OpenVINO in f32 as well; a graph OpenVINO runs
    past 1e-5 stops the build in one line naming the engine."""
    from bucketing.engines import openvino_engine
    from model_store import build

    common = ["--model-dir", str(tiny_embedder_dir), "--strategies", "bucketed", "--print-commands"]
    assert build.main([*common, "--engine", "openvino", "--stage-dir", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "extra" / "model" / ONNX_FILE).is_file()
    real = openvino_engine.OvEngine.__call__
    monkeypatch.setattr(openvino_engine.OvEngine, "__call__", lambda self, *a: real(self, *a) + 1e-3)
    assert build.main([*common, "--engine", "openvino", "--stage-dir", str(tmp_path / "off")]) == 2
    err = capsys.readouterr().err
    assert "the exported ONNX graph on openvino differs from the torch model by 1.00e-03" in err, err


def test_onnxruntime_threads_do_not_spin(onnx_dirs):
    """ONNX Runtime's pools sleep when they wait (`SPIN_OFF`): a spinning thread takes the core from other workers."""
    from bucketing.engines.onnx_engine import SPIN_OFF, OrtEngine

    options = OrtEngine(onnx_dirs["embedding"] / ONNX_FILE, 2, "cpu").session.get_session_options()
    assert [options.get_session_config_entry(key) for key in SPIN_OFF] == ["0", "0"]


def test_openvino_shares_its_arrays_and_answers_stay_its_own(onnx_dirs):
    """`infer` reads our arrays in place and hands its outputs as views (`SHARED`): whatever the shapes in turn
    (larger after smaller, a non-contiguous slice), every pass answers as a fresh engine does, and an answer is a copy
    that the next pass does not overwrite."""
    from bucketing.engines.openvino_engine import OvEngine

    path = onnx_dirs["embedding"] / ONNX_FILE
    engine = OvEngine(path, 1, "float32")
    rng = np.random.default_rng(3)
    wide = rng.integers(1000, 2000, size=(5, 40), dtype=np.int64)
    shapes = [wide[:1, :8], wide[:, :40], wide[:2, 3:20], wide[:3, :11]]  # the third not C-contiguous
    answers = []
    for ids in shapes:
        mask = np.ones_like(ids)
        mask[-1, ids.shape[1] // 2 :] = 0
        answers.append((engine(ids, mask), OvEngine(path, 1, "float32")(np.ascontiguousarray(ids), mask)))
        pooled, tokens = engine.states(ids, mask)
        assert np.array_equal(pooled, answers[-1][1]) and tokens.shape == (*ids.shape, tokens.shape[2])
    for got, fresh in answers:
        assert np.array_equal(got, fresh)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
def test_pass_cost_stubs_and_times_an_engine_and_leaves_it_as_it_was(onnx_dirs, tiny_embedder_dir, engine):
    """bench.probes.pass_timing: with its native call stubbed (found by what holds it, the engine unnamed) an engine
    still runs our wrapper (and answers the stub's zeros); after it, and through the timing proxy, it answers as
    before."""
    import time

    from bench.probes import pass_timing as pass_cost

    folder = tiny_embedder_dir if engine == "torch" else onnx_dirs["embedding"]
    handler, _ = make_handler(folder, engine=engine, max_length=128)
    run = handler.task.engine
    ids, mask = pass_cost.plain(1, 8)
    before = run(ids, mask)
    with pass_cost.stubbed(run, 1) as stubbed:
        assert stubbed and not run(ids, mask).any()
    spent = pass_cost.Spent(time.perf_counter)
    timed = spent.engine(run)
    assert np.array_equal(run(ids, mask), before) and np.array_equal(timed(ids, mask), before)
    assert timed.fidelity is None and timed.name == engine and spent.seconds["engine"] > 0


def onednn_reorders_bfloat16() -> bool:
    """Whether this CPU's oneDNN reorders a bfloat16 Linear weight (it asks the CPU, not /proc/cpuinfo: a CPU without
    avx_ne_convert or avx512bw/vl/dq is refused, whatever the `bf16_cpu` fixture says)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), None)
    except RuntimeError:
        return False
    return True


def test_bfloat16_weights_are_packed_once_and_answer_as_torch_s_own_linear(tiny_embedder_dir, bf16_cpu, monkeypatch):
    """torch in bfloat16 on the CPU runs its encoder's Linear layers on weights oneDNN reordered once at load
    (`PackedLinear`): traced and eager, the same numbers as torch's own linear, which reorders them every pass; where
    packing fails or changes a number, the layers stay as they were."""
    from bucketing.engines import torch_engine
    from bucketing.engines.base import probe
    from bucketing.model.head import load_head

    def opened(torchscript=True):
        head, info = load_head("embedding", str(tiny_embedder_dir))
        linears = sum(type(m) is torch.nn.Linear for m in head.model.modules())
        return torch_engine.TorchEngine(head, "cpu", torch.bfloat16, torchscript, info.vocab_size), linears

    ids, mask, pool_mask = probe(1000)
    packed, linears = opened()
    if onednn_reorders_bfloat16():
        assert packed.packed == linears > 0 and packed.traced is not None
        assert not any(type(m) is torch.nn.Linear for m in packed.head.model.modules())
    else:  # oneDNN refuses (Zen 3: "bf16 path needs ... avx512bw"): the engine keeps torch's own linear, logged
        assert packed.packed == 0 and packed.traced is not None and linears > 0
        assert sum(type(m) is torch.nn.Linear for m in packed.head.model.modules()) == linears
    with monkeypatch.context() as patch:
        patch.setattr(torch_engine, "pack_linears", lambda engine, vocab_size: 0)
        plain, _ = opened()
    assert plain.packed == 0 and plain.traced is not None
    for a, b in zip(
        (packed(ids, mask, pool_mask), packed.states(ids, mask, pool_mask)[0]),
        (plain(ids, mask, pool_mask), plain.states(ids, mask, pool_mask)[0]),
        strict=True,
    ):
        assert np.array_equal(a, b)

    def refused(self, linear):  # what oneDNN raises on a CPU without avx512bw or avx_ne_convert (AMD Zen 3)
        raise RuntimeError("bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq")

    with monkeypatch.context() as patch:
        patch.setattr(torch_engine.PackedLinear, "__init__", refused)
        kept, linears = opened(torchscript=False)
    assert kept.packed == 0 and sum(type(m) is torch.nn.Linear for m in kept.head.model.modules()) == linears

    def changed(self, x):
        return torch.nn.functional.linear(x, self.packed.to_dense()) * 2

    with monkeypatch.context() as patch:
        patch.setattr(torch_engine.PackedLinear, "forward", changed)  # a packing that changes the numbers
        kept, linears = opened(torchscript=False)
    assert kept.packed == 0 and sum(type(m) is torch.nn.Linear for m in kept.head.model.modules()) == linears
