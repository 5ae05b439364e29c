"""What BGE-M3's outputs cost a delivered batch: one pass gives all three, so asking more costs only their answers.

`python -m bench.probes.outputs [--model-dir DIR | --shape minilm|bge-m3] [--engine torch] [--threads 1]
[--requests 16] [--workload passages] [--rounds 5] [--repeat 5] [--clock cpu|wall]`: a folder laid out as
BAAI/bge-m3 (`--model-dir`; without it, `m3_folder` builds one: random heads of BGE-M3's shapes beside MiniLM's
encoder, or beside a random encoder of BGE-M3's size) opened as a worker opens it (`BucketingHandler.initialize`,
task bgem3), and a delivered batch of `--requests` one-text requests of the bench's `--workload` through the handler
in process, asking each set of outputs in turn: dense, sparse, colbert, all three; in our JSON and in KServe v2 with
binary tensors. Best handler call of `--rounds` x `--repeat`, the sets in turn each round; beside it the engine
calls' part and what is outside them, and the answer bytes per text. Every set runs the same passes (the graph
computes all three outputs): their times differ only by the machine's noise, so `x dense` is what asking a set costs
against dense alone on the same passes: (the fastest engine calls of the format's sets + the set's time outside
them) / (the same + dense's). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.inputs.workloads import WORKLOADS, make_workload
from bench.probes.engine_cost import cpu_name
from bench.probes.pass_timing import CLOCKS, Spent, timed_handler
from bucketing.engines import precision
from model_store.archives import minilm_dir

OUTPUT_SETS = (("dense",), ("sparse",), ("colbert",), ("dense", "sparse", "colbert"))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
MINILM_FILES = ("config.json", "model.safetensors", *TOKENIZER_FILES)
LABELS = {  # what --shape builds when no --model-dir is given
    "minilm": "MiniLM's encoder with random BGE-M3 heads (384 -> 1, 384 -> 384)",
    "bge-m3": "a random encoder of BGE-M3's size (24 x 1024) with random heads (1024 -> 1, 1024 -> 1024)",
}
SHAPES = tuple(LABELS)


@dataclass(frozen=True)
class Format:
    """How a request asks a set of outputs (posted to the model's URL): its body."""

    name: str
    body: Callable[[str, tuple[str, ...]], dict[str, Any]]


FORMATS = (
    Format("ours, JSON", lambda text, outputs: {"texts": [text], "outputs": list(outputs)}),
    Format(
        "KServe v2, binary",
        lambda text, outputs: {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
            "parameters": {"outputs": list(outputs), "binary_data_output": True},
        },
    ),
)


@dataclass(frozen=True)
class Cost:
    """One set of outputs in one format: the best handler call, its engine calls, and the answer bytes per text."""

    handler_s: float
    engine_s: float
    bytes_per_text: float

    @property
    def outside_s(self) -> float:
        """The call's time outside its engine calls: parsing, tokenizing, planning, the answers."""
        return self.handler_s - self.engine_s


def m3_folder(target: Path, shape: str, seed: int = 0) -> Path:
    """A folder the bgem3 kind serves, with random heads of BGE-M3's shapes beside its encoder (BAAI/bge-m3 itself is
    not on this machine): `minilm`, MiniLM's encoder (the shipped weights); `bge-m3`, a random encoder of BGE-M3's
    size (24 layers, 1024 wide, 16 heads, 4096 inner: its cost a token), on MiniLM's tokenizer (the vocabulary
    changes no pass's cost)."""
    from transformers import BertConfig, BertModel

    target.mkdir(parents=True, exist_ok=True)
    for name in MINILM_FILES if shape == "minilm" else TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, target / name)
    torch.manual_seed(seed)
    if shape == "bge-m3":
        minilm = json.loads((minilm_dir() / "config.json").read_text())
        config = BertConfig(
            vocab_size=minilm["vocab_size"],
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=minilm["max_position_embeddings"],
        )
        BertModel(config, add_pooling_layer=False).save_pretrained(target)
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), target / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), target / "colbert_linear.pt")
    return target


def one_call(
    handler: Any, context: Any, spent: Spent, fmt: Format, outputs: tuple[str, ...], texts: tuple[str, ...]
) -> Cost:
    """A delivered batch of one-text requests asking `outputs` in `fmt`: its handler call and answer bytes."""
    rows = [{"body": json.dumps(fmt.body(t, outputs)).encode()} for t in texts]
    context.with_requests(["application/json"] * len(rows))
    spent.seconds = {}
    start = spent.clock()
    replies = handler.handle(rows, context)
    total = spent.clock() - start
    bad = [s for s, _ in context.status.values() if s != 200]
    if bad:
        raise SystemExit(f"{fmt.name} {'+'.join(outputs)}: answered {bad[0]}: {str(replies[0])[:300]}")
    size = sum(len(r) if isinstance(r, bytes | str) else len(json.dumps(r)) for r in replies)
    return Cost(total, spent.seconds.get("engine", 0.0), size / len(texts))


def measure(
    handler: Any, context: Any, spent: Spent, texts: tuple[str, ...], rounds: int, repeat: int
) -> dict[tuple[str, tuple[str, ...]], Cost]:
    """Each format and set of outputs' best call, the sets in turn each round (a load falls on each alike)."""
    best: dict[tuple[str, tuple[str, ...]], Cost] = {}
    for fmt in FORMATS:
        for outputs in OUTPUT_SETS:
            one_call(handler, context, spent, fmt, outputs, texts)  # first calls are not a batch's
    for _ in range(rounds):
        for fmt in FORMATS:
            for outputs in OUTPUT_SETS:
                for _ in range(repeat):
                    got = one_call(handler, context, spent, fmt, outputs, texts)
                    key = (fmt.name, outputs)
                    if key not in best or got.handler_s < best[key].handler_s:
                        best[key] = got
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a folder laid out as BAAI/bge-m3 (default: one of --shape)")
    parser.add_argument("--shape", choices=SHAPES, default="minilm", help="the folder built without --model-dir")
    parser.add_argument("--engine", default="torch", help="torch, onnxruntime or openvino (float32)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16, help="one-text requests in the delivered batch")
    parser.add_argument("--workload", choices=WORKLOADS, default="passages")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the sets in turn; the best kept")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls a round, per set")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    texts = make_workload(args.workload, args.requests, seed=0).texts
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model_dir or m3_folder(Path(tmp) / "m3", args.shape)
        section = {"model_path": str(folder), "task": "bgem3", "engine": args.engine, "torch_threads": args.threads}
        handler, context, spent = timed_handler({**section, "cost": {"calibrate": False}}, "m3", clock)
        with torch.inference_mode():
            best = measure(handler, context, spent, texts, args.rounds, args.repeat)
    label = args.model_dir or LABELS[args.shape]
    bf16 = precision.native_bf16(precision.cpu_info()) or "none"
    print(f"# {cpu_name()} (native bf16: {bf16}); {args.threads} thread(s)")
    print(f"# {label}; {args.engine} float32; {args.requests} one-text requests of `{args.workload}` a call")
    print(f"# clock: {args.clock}; best of {args.rounds} rounds x {args.repeat}, the sets in turn each round")
    print()
    print("| format | outputs | handler call (ms) | engine calls (ms) | outside them (ms) | x dense | bytes a text |")
    print("|---|---|---|---|---|---|---|")
    for fmt in FORMATS:
        passes = min(best[(fmt.name, o)].engine_s for o in OUTPUT_SETS)
        dense = passes + best[(fmt.name, ("dense",))].outside_s
        for outputs in OUTPUT_SETS:
            c = best[(fmt.name, outputs)]
            print(
                f"| {fmt.name} | {' + '.join(outputs)} | {c.handler_s * 1e3:.2f} | {c.engine_s * 1e3:.2f} "
                f"| {c.outside_s * 1e3:.2f} | {(passes + c.outside_s) / dense:.3f} | {c.bytes_per_text:,.0f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
