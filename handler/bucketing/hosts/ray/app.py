"""The Ray Serve application: a deployment per model (`Encoder`, named after the model, one opened worker per
replica) behind one HTTP ingress (`Ingress`, the shared route table through `front.Front`).

`build(args)` is the application builder `serve run`, `serve deploy` and KubeRay's `RayService` name
(`import_path: bucketing.hosts.ray.app:build`, config/ray/serve.yaml). Its `args`:

    models:                       # one deployment each, named after the model
      - model: /abs/path/minilm-bucketed.mar   # an archive, a folder holding one, or a model folder (absolute:
        name: minilm-bucketed                  # every node reads it at that path); name: else the archive's
        threads: 1                # handler.torch_threads (and the replica's num_cpus), else the model-config's
        batch_size: 16            # requests per batch at most, else the model-config's batchSize
        max_batch_delay_ms: 10    # else its maxBatchDelay
        max_batch_tokens: 8192    # estimated tokens per batch at most, else handler.max_batch_tokens
        ray_actor_options: {}     # merged over {"num_cpus": threads} (custom resources, ...)
        autoscaling_config: {}    # merged over AUTOSCALING
    key_file: /abs/path/key_file.json   # the inference key (TorchServe's shape; written when absent), else
    no_auth: false                      # $BUCKETING_INFERENCE_KEY; no_auth: true serves without one
    max_request_bytes: 8388608
    request_timeout_s: 120              # else the largest model responseTimeout

A deployment's options may also be set by the config's `deployments:` section (by the model's name, `Ingress`).

Metrics: each replica keeps a `bucketing.metrics.QueueSignals` fed by its batcher (the standalone host's) and
pushes its samples every `PUSH_S` to one small named actor (`Board`, 0 CPU); the ingress's `GET /metrics` reads the
board once and answers every model's series summed over the replicas that pushed within `STALE_S` (`summed`), with
the standalone host's names and `ModelName` label; the handler's counters (`bucket_*_total`, the pass histograms)
likewise. The gauges are the ingress's own count of what it sent each model and has not answered (exact, fresh: a
replica sees only what Ray's router gave it, at most `max_ongoing_requests`), split into running and waiting by the
replicas' in-flight figure (`batching.at_ingress`). Fresh to about `PUSH_S`; it costs one small actor call per
replica per `PUSH_S`, and one per scrape.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import RayActorError, WorkerCrashedError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import Response

from bucketing.hosts.answers import Answer, unavailable
from bucketing.hosts.ray.args import INGRESS, AppArgs, ArgsError, ModelArgs, read_spec
from bucketing.hosts.ray.batching import Item, Pending, model_signals
from bucketing.hosts.ray.board import PUSH_S, STALE_S, board
from bucketing.hosts.ray.front import Front, Limits
from bucketing.hosts.rows import torchserve_row
from bucketing.hosts.standalone import models
from bucketing.hosts.standalone.__main__ import KEY_ENV, read_key
from bucketing.hosts.standalone.app import serve_jobs
from bucketing.hosts.standalone.batcher import Batcher, Job, Refused
from bucketing.hosts.standalone.prometheus import Registry
from bucketing.metrics import BatchStats, QueueSignals, Sample

logger = logging.getLogger("bucketing.hosts.ray")

# A model deployment's autoscaling unless the args or the config say otherwise: Ray Serve's own rule (replicas =
# ongoing requests / target), reacting within seconds (the defaults wait 30 s up and 600 s down).
AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target_ongoing_requests": 8,
    "upscale_delay_s": 3.0,
    "downscale_delay_s": 30.0,
    "look_back_period_s": 15.0,  # over Ray's 10 s metrics interval
}
QUEUE_SIZE = 256  # requests queued per model at the ingress's handle (TorchServe's job_queue_size): then a 503
GRACEFUL_SHUTDOWN_S = 25.0  # a replica stopping (scale-down, redeploy) answers what it holds within this
RETRIES = 2  # a request whose replica died is sent again (embedding is idempotent), this many times
READY_TIMEOUT_S = 2.0


def join_replica_log() -> None:
    """Our loggers (`bucketing.*`: the worker's ready line, a request's failure) write into the replica's own log
    (`logs/serve/replica_*.log`) through Ray Serve's handlers, INFO and up, as its own lines do; else Python keeps
    only their warnings, on the worker's stderr."""
    serve, ours = logging.getLogger("ray.serve"), logging.getLogger("bucketing")
    if serve.handlers:
        ours.handlers = list(serve.handlers)
        ours.setLevel(logging.INFO)
        ours.propagate = False


class Encoder:
    """One replica of a model: its opened worker on one thread, behind the standalone host's batcher (one worker):
    a batch is closed by requests, tokens or delay when the worker is free to take it, never while it is busy."""

    def __init__(self, margs: ModelArgs) -> None:
        join_replica_log()
        self._unpacked = tempfile.TemporaryDirectory(prefix="bucketing-ray-")
        spec = read_spec(margs, Path(self._unpacked.name))
        self.name = spec.name
        import torch

        torch.set_num_threads(spec.config.torch_threads)  # as the handler does per worker
        self.signals = QueueSignals(spec.config.capacity_tokens_per_s)
        self.batcher = Batcher(
            serve=self._serve,
            workers=1,
            batch_size=spec.batch_size,
            max_delay_s=spec.max_batch_delay_ms / 1000.0,
            max_batch_tokens=spec.config.max_batch_tokens,
            queue_size=QUEUE_SIZE,
            signals=self.signals,
        )
        self.worker = self.batcher.executor(0).submit(_open, spec).result()  # opened on the thread that serves it
        self._started = False
        self.served = 0  # requests answered by this replica
        self.counts = Registry()  # the handler's counters on this replica (`bucket_*_total`, pass histograms)
        self._counts_lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._push, name=f"bucketing-signals-{spec.name}", daemon=True).start()
        logger.info("%s", self.worker.ready_line())

    async def predict(self, item: Item) -> Answer:
        if not self._started:  # the batcher's task, on the loop Ray runs this replica's requests on
            self.batcher.start()
            self._started = True
        try:
            job = self.batcher.submit(item, item.tokens)
        except Refused as e:
            return unavailable(f'Model "{self.name}": {e}; retry shortly')
        answer: Answer = await job.future
        self.served += 1
        return answer

    def _serve(self, worker: int, jobs: Sequence[Job]) -> list[Answer | None]:
        """The batcher's call, on the worker's thread: the batch's answers (None: pending, sent again)."""
        answers, stats = serve_jobs(self.worker, self.name, jobs, item_row)
        self._record(stats)
        return answers

    def queue(self) -> dict[str, int]:
        """Queue depth and tokens waiting, and requests running, on this replica."""
        waiting = list(self.batcher.queue)
        return {"requests": len(waiting), "tokens": sum(j.tokens for j in waiting), "running": self.batcher.in_flight}

    def _record(self, stats: BatchStats) -> None:
        with self._counts_lock:
            self.counts.record(self.name, stats)

    def signal_samples(self) -> list[Sample]:
        """This replica's queue signals and handler counters now (unlabelled: summed per model by the ingress)."""
        with self._counts_lock:
            counters = [
                (name, "counter", tuple(kv for kv in labels if kv[0] != "ModelName"), value)
                for name, series in self.counts.counters.items()
                for labels, value in series.items()
            ]
        return [*self.signals.samples(), *counters]

    def _push(self) -> None:
        """Every `PUSH_S`: this replica's queue signals to the board (until the replica goes)."""
        import ray

        replica = ray.get_runtime_context().get_actor_id() or str(os.getpid())
        handle = None
        while True:
            try:
                handle = handle or board()
                ray.get(handle.put.remote(self.name, replica, self.signal_samples()), timeout=STALE_S)
            except Exception:  # noqa: BLE001 - the board went away (its owner did): made again next time
                handle = None
            if self._stop.wait(PUSH_S):
                return

    def ready(self) -> bool:
        return True  # a replica is routed to only once its constructor (the worker's opening) returned

    def where(self) -> dict[str, Any]:
        """This replica's process and node (tests, operators)."""
        import ray

        context = ray.get_runtime_context()
        node, actor = context.get_node_id(), context.get_actor_id()
        return {"pid": os.getpid(), "node_id": node, "actor_id": actor, "served": self.served}

    def __del__(self) -> None:
        self._stop.set()
        self.batcher.executor(0).shutdown(wait=False)
        self._unpacked.cleanup()


def item_row(item: Item) -> tuple[Any, Any]:
    return torchserve_row(item.body, item.headers, item.url_path)


def _open(spec: models.ModelSpec) -> Any:
    from bucketing import worker

    return worker.open(spec.config, spec.model_dir, None, spec.model_yaml)


class Ingress:
    """The HTTP ingress: every path (`route_prefix: /`) through `Front`, each model's requests to its deployment."""

    def __init__(
        self, handles: Mapping[str, Any], versions: Mapping[str, str], args: AppArgs, timeout_s: float
    ) -> None:
        join_replica_log()
        if args.no_auth:
            key = None
        elif args.key_file is None and not os.environ.get(KEY_ENV):
            raise ArgsError(f"authorization is on: give key_file, set ${KEY_ENV}, or no_auth: true")
        else:
            key = read_key(Path(args.key_file) if args.key_file else None)
        self.handles = dict(handles)
        self.names = list(versions)
        self.pending = {name: Pending() for name in versions}  # sent to each model's deployment, not yet answered
        self._board: Any = None
        limits = Limits(key, args.max_request_bytes, args.request_timeout_s or timeout_s)
        self.front = Front(versions, self._predict, self._ready, limits, self._metrics)

    async def __call__(self, request: Request) -> Response:
        scope = request.scope
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        answer = await self.front.answer(request.method, scope["path"], headers, request.receive)
        out = {"content-type": answer.content_type, **dict(answer.headers)}
        body = b"" if request.method == "HEAD" else answer.body
        return Response(body, answer.status, headers=out)

    async def drain(self, timeout_s: float) -> dict[str, Any]:
        """Stop admitting predictions and answer those admitted (`Front.drain`; `bucketing.hosts.ray.drain` calls
        it before the cluster stops): whether all were answered, and how many are still running."""
        logger.info("draining (new requests get 503) for up to %g s", timeout_s)
        answered = await self.front.drain(timeout_s)
        logger.info("drain: %s", "every admitted request answered" if answered else "requests still unanswered")
        return {"answered": answered, "in_flight": self.front.in_flight}

    async def _predict(self, name: str, item: Item) -> Answer:
        pending = self.pending[name]
        pending.requests += 1
        pending.tokens += item.tokens
        try:
            return await self._send(name, item)
        finally:
            pending.requests -= 1
            pending.tokens -= item.tokens

    async def _send(self, name: str, item: Item) -> Answer:
        handle = self.handles[name]
        for attempt in range(RETRIES + 1):
            try:
                answer: Answer = await handle.predict.remote(item)
                return answer
            except BackPressureError:
                return unavailable(f'Model "{name}": the queue is full ({QUEUE_SIZE} requests waiting); retry shortly')
            except (RayActorError, WorkerCrashedError) as e:  # the replica died (killed, its node lost)
                logger.warning("model %s: replica lost (%s), attempt %d", name, type(e).__name__, attempt + 1)
                if attempt == RETRIES:
                    return unavailable(f'Model "{name}": its replica was lost ({type(e).__name__}); retry shortly')
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _metrics(self) -> str:
        """`/metrics`: the queue signals of every model, summed over its replicas (read from the board)."""
        latest: dict[str, list[list[Sample]]] = {}
        try:
            self._board = self._board or board()
            latest = await asyncio.wait_for(self._board.read.remote(STALE_S), READY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no board now: zeros, and it is asked for again next time
            self._board = None
        return Registry().render(samples=model_signals(self.names, latest, self.pending))

    async def _ready(self, name: str) -> bool:
        try:
            return bool(await asyncio.wait_for(self.handles[name].ready.remote(), READY_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - not ready, whatever the reason
            return False


def build(args: Mapping[str, Any]) -> Any:
    """The application of `args` (see the module's docstring): a deployment per model, behind the ingress."""
    app_args = AppArgs.parse(args)
    handles: dict[str, Any] = {}
    versions: dict[str, str] = {}
    timeout_s = 0.0
    for margs in app_args.models:
        with tempfile.TemporaryDirectory(prefix="bucketing-ray-build-") as unpack_dir:
            spec = read_spec(margs, Path(unpack_dir))
        if spec.name in versions or spec.name == INGRESS:
            raise ArgsError(f"bucketing.hosts.ray args: two models named {spec.name!r} (or one named Ingress)")
        versions[spec.name] = spec.version
        timeout_s = max(timeout_s, spec.response_timeout_s)
        actor = {"num_cpus": spec.config.torch_threads, **margs.ray_actor_options}
        deployment = serve.deployment(
            name=spec.name,
            ray_actor_options=actor,
            autoscaling_config={**AUTOSCALING, **margs.autoscaling_config},
            max_ongoing_requests=2 * spec.batch_size,  # one batch running, the next one filling
            max_queued_requests=QUEUE_SIZE,
            graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        )(Encoder)
        # the replica's own args: options left out, so changing them (autoscaling) updates without a restart
        handles[spec.name] = deployment.bind(
            replace(margs, name=spec.name, ray_actor_options={}, autoscaling_config={})
        )
    ingress = serve.deployment(
        name=INGRESS,
        ray_actor_options={"num_cpus": 0},  # it only awaits: no CPU held from the replicas
        max_ongoing_requests=4 * QUEUE_SIZE,
        num_replicas=1,
    )(Ingress)
    return ingress.bind(handles, versions, app_args, timeout_s)


__all__ = [
    "AUTOSCALING",
    "AppArgs",
    "ArgsError",
    "Encoder",
    "Ingress",
    "ModelArgs",
    "build",
    "model_signals",
    "read_spec",
]
