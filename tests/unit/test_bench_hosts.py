"""bench/hosts: the `--hosts` axis (each configuration on each host in turn, checked in one line), the target seam
dispatching each job to its configuration's host, the standalone target's command line and metrics, and a run on
fake hosts writing the host into results.csv, results.json, the report's host sections and the plots; a third
host is one module-like object and one registry line."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench import compare, hosts
from bench.harness import stats
from bench.harness.measure import Measurer
from bench.harness.results import ReportInputs
from bench.harness.run_plan import RunPlan
from bench.harness.targets import TorchServeSite, model_name
from bench.hosts import HostRun
from bench.hosts.ray import RayModel, application, tree_cpu_seconds
from bench.hosts.standalone import StandaloneModel
from bench.inputs.configuration import TORCHSERVE, Configuration
from bench.inputs.job import Job
from bench.kinds import RUN_KINDS, RunContext
from tests.unit.test_bench_run_loop import CONFIGS, Fake, FakeResolver, FakeTarget
from tsctl import Client, Endpoints

SMALL = ["--strategies", "bucketed,dynamic", "--batch-sizes", "16", "--duration", "2"]


def plan(argv: list[str]) -> RunPlan:
    options = compare.parse_args(argv)
    got = compare.plan_from_args(options)
    compare.check_args(options, got)
    return got


def host_run(tmp_path: Path) -> HostRun:
    site = TorchServeSite(Client(Endpoints.on_ports(1, 2, 3), None), None)
    return HostRun(site, tmp_path / "store", tmp_path / "work")


# --- the axis --------------------------------------------------------------------------------------------------


def test_without_hosts_every_configuration_runs_on_torchserve_named_as_before():
    configs = plan(SMALL).configs
    assert [c.host for c in configs] == [TORCHSERVE, TORCHSERVE]
    assert [c.name for c in configs] == ["bucketed bs16", "dynamic bs16"]


def test_hosts_runs_each_configuration_on_each_host_in_turn():
    configs = plan([*SMALL, "--hosts", "torchserve,standalone"]).configs
    assert [(c.name, c.host) for c in configs] == [
        ("bucketed bs16", "torchserve"),
        ("bucketed bs16 on standalone", "standalone"),
        ("dynamic bs16", "torchserve"),
        ("dynamic bs16 on standalone", "standalone"),
    ]
    same = {replace(c, host=TORCHSERVE) for c in configs}  # nothing but the host differs within a pair
    assert len(same) == 2


def test_the_hosts_suite_pairs_closed_loop_and_light_open_loop_per_host():
    configs = plan(["--suite", "hosts"]).configs
    assert [(c.host, c.mode, c.rate) for c in configs] == [
        ("torchserve", "closed", None),
        ("standalone", "closed", None),
        ("ray", "closed", None),
        ("torchserve", "open", 10),
        ("standalone", "open", 10),
        ("ray", "open", 10),
    ]
    assert plan(["--suite", "hosts", "--hosts", "standalone,torchserve"]).configs == (  # crossed once each
        configs[1],
        configs[0],
        configs[4],
        configs[3],
    )


def test_bulk_runs_per_host():
    configs = plan(["--suite", "bulk", "--hosts", "torchserve,standalone", "--bulk-texts", "512"]).configs
    assert [c.host for c in configs] == ["torchserve", "standalone"] * 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hosts", "torchserve,rayserve"], "--hosts: got rayserve; allowed: torchserve | standalone"),
        (["--suite", "tune", "--p99-ms", "100", "--hosts", "standalone"], "--hosts standalone: not with --suite tune"),
        (["--workload", "long", "--hosts", "torchserve,standalone"], "--hosts standalone: not with --workload long"),
    ],
)
def test_host_errors_are_one_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        plan(argv)


def test_help_lists_the_hosts_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        compare.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--hosts HOSTS" in text and "comma list of torchserve,standalone" in text


def test_a_peer_runs_once_per_load_whatever_hosts_ours_ran_on():
    configs = plan(["--strategies", "bucketed", "--batch-sizes", "16", "--hosts", "torchserve,standalone"]).configs
    peers = compare.peer_configs(configs, "infinity")
    assert len(peers) == 1 and peers[0].host == TORCHSERVE and peers[0].peer == "infinity"


# --- the standalone target -------------------------------------------------------------------------------------


def test_the_standalone_server_gets_the_archive_and_the_registration_settings(tmp_path, monkeypatch):
    monkeypatch.setattr("bench.hosts.standalone.archive", lambda store, config: "minilm-bucketed-t2.mar")
    config = Configuration("bucketed", 8, max_batch_delay=20, workers=3, threads=2, host="standalone")
    job = Job(config, FakeResolver().load(config))
    target = hosts.targets(host_run(tmp_path))(job)
    assert isinstance(target, StandaloneModel)
    source, extra = target.arguments()
    assert source == ["--archive", str(tmp_path / "store" / "minilm-bucketed-t2.mar"), "--name", target.name]
    flags = dict(zip(extra[::2], extra[1::2], strict=True))
    assert flags["--workers"] == "3" and flags["--threads"] == "2"
    assert flags["--batch-size"] == "8" and flags["--max-batch-delay"] == "20"
    assert target.url.startswith("http://127.0.0.1:") and target.url.endswith(f"/predictions/{target.name}")
    assert target.server.workdir == (tmp_path / "work" / "standalone" / target.name).resolve()


def test_the_ray_cluster_gets_the_archive_and_workers_x_threads_as_replicas_x_threads(tmp_path, monkeypatch):
    monkeypatch.setattr("bench.hosts.ray.archive", lambda store, config: "minilm-bucketed-t2.mar")
    config = Configuration("bucketed", 8, max_batch_delay=20, workers=3, threads=2, host="ray")
    job = Job(config, FakeResolver().load(config))
    target = hosts.targets(host_run(tmp_path))(job)
    assert isinstance(target, RayModel)
    assert target.archive_path() == tmp_path / "store" / "minilm-bucketed-t2.mar"
    assert target.server.num_cpus == 6 and target.server.url.startswith("http://127.0.0.1:")
    assert target.url == f"{target.server.url}/predictions/{target.name}"
    assert target.server.workdir == (tmp_path / "work" / "ray" / target.name).resolve()
    app = application(config, target.name)["applications"][0]
    model = app["args"]["models"][0]
    assert (model["batch_size"], model["max_batch_delay_ms"], model["threads"]) == (8, 20, 2)
    (deployment,) = [d for d in app["deployments"] if d["name"] == model["name"]]
    # fixed: Ray keeps the app's code autoscaling beside a config's num_replicas unless the config says null
    assert deployment["num_replicas"] == 3 and deployment["autoscaling_config"] is None
    assert deployment["max_ongoing_requests"] == 16


def test_the_ray_target_starts_and_stops_through_tsctl_and_reads_its_metrics(tmp_path, monkeypatch):
    """Entered: `RayServe.start` on the archive under the model's name with the batch settings; `counters` from
    the ingress's /metrics; left: stopped, on an exception too."""
    calls: list[tuple] = []

    class FakeRayServe:
        url, log, process = "http://127.0.0.1:1", tmp_path / "ray.out", None

        def __init__(self, workdir, port, num_cpus):
            self.num_cpus = num_cpus

        def start(self, archive, name, threads=None, base=None, timeout=0.0):
            calls.append(("start", archive.name, name, threads, base["applications"][0]["args"]["models"][0]))
            return self

        def stop(self):
            calls.append(("stop",))

        def headers(self):
            return {"Authorization": "Bearer k"}

    class Reply:
        status = 200
        body = b'bucket_real_tokens_total{ModelName="NAME"} 42\nbucket_queue_requests{ModelName="NAME"} 0\n'

    monkeypatch.setattr("bench.hosts.ray.RayServe", FakeRayServe)
    monkeypatch.setattr("bench.hosts.ray.archive", lambda store, config: "a.mar")
    monkeypatch.setattr("bench.hosts.ray.COUNTERS_WAIT_S", 0.0)
    seen: list[str] = []

    def fake_request(url, headers=None):
        seen.append(url)
        reply = Reply()
        reply.body = reply.body.replace(b"NAME", model_name(config).encode())
        return reply

    monkeypatch.setattr("bench.hosts.own_server.request", fake_request)
    config = Configuration("bucketed", 4, max_batch_delay=5, workers=1, threads=1, host="ray")
    target = hosts.targets(host_run(tmp_path))(Job(config, FakeResolver().load(config)))
    assert isinstance(target, RayModel)
    with pytest.raises(RuntimeError), target:
        assert target.counters()["bucket_real_tokens_total"] == 42
        assert target.cpu() is None and target.peak_rss_mb() is None
        raise RuntimeError("the load failed")
    assert seen == ["http://127.0.0.1:1/metrics"]
    assert calls[0][:4] == ("start", "a.mar", target.name, 1)
    assert calls[0][4]["batch_size"] == 4 and calls[-1] == ("stop",)


def test_the_ray_cpu_counts_the_process_tree():
    import subprocess
    import sys

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('burned', flush=True)\ntime.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "burned\n"  # however slow the machine
        assert tree_cpu_seconds(os.getpid()) >= tree_cpu_seconds(child.pid) >= 0.2
    finally:
        child.kill()
        child.wait()


def test_the_standalone_metrics_give_the_handler_counters():
    text = (
        "# TYPE bucket_real_tokens_total counter\n"
        'bucket_real_tokens_total{ModelName="m"} 120\n'
        'bucket_real_tokens_total{ModelName="other"} 7\n'
        'bucket_padded_tokens_total{ModelName="m"} 160\n'
        'bucket_batch_size_bucket{ModelName="m",le="+Inf"} 3\n'
    )
    counters = stats.parse_prometheus(text, "m")
    assert counters["bucket_real_tokens_total"] == 120 and counters["bucket_padded_tokens_total"] == 160


# --- a run on fake hosts ---------------------------------------------------------------------------------------


class FakeHost:
    """A host as a module would be: its NAME and `target`; its targets answer through `Fake.send`, faster off
    TorchServe (so the ratios are not one)."""

    def __init__(self, fake: Fake, name: str, started: list[str]) -> None:
        self.fake, self.NAME, self.started = fake, name, started

    def target(self, job: Job, run: HostRun) -> FakeTarget:
        self.started.append(f"{self.NAME}: {job.config.name}")
        target = FakeTarget(self.fake, job)
        target.url = f"fake://{job.config.name}"
        return target


def fake_run(tmp_path: Path, names: tuple[str, ...], configs: tuple[Configuration, ...]) -> list[str]:
    fake, started = Fake(tmp_path), list[str]()
    registry: dict[str, hosts.Host] = {name: FakeHost(fake, name, started) for name in names}
    crossed = hosts.across(configs, ",".join(names), registry)
    run_plan = RunPlan("fake", "a fake plan", crossed, False, None)

    def send(spec):  # every host but TorchServe answers in half the time
        result = fake.send(spec)
        if " on " in spec.url:
            return replace(
                result, wall_s=result.wall_s / 2, samples=tuple(replace(s, latency_ms=5.0) for s in result.samples)
            )
        return result

    ctx = RunContext(
        plan=run_plan,
        resolver=FakeResolver(),
        target=hosts.targets(host_run(tmp_path), registry),
        measurer=Measurer(send, warmup_s=0.0),
        inputs=ReportInputs(RUN_KINDS[run_plan.kind].TITLE, {"command": "fake"}),
        record=lambda summary: None,
        out=tmp_path,
        t0=0.0,
    )
    assert compare.measure_all(ctx) == 0
    return started


def test_a_run_on_two_hosts_names_the_host_everywhere_and_compares_them(tmp_path):
    started = fake_run(tmp_path, ("torchserve", "standalone"), CONFIGS[:2])
    assert started == [
        "torchserve: bucketed bs16",
        "standalone: bucketed bs16 on standalone",
        "torchserve: dynamic bs16",
        "standalone: dynamic bs16 on standalone",
    ]
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], r["host"], r["server"]) for r in rows] == [
        ("bucketed bs16", "torchserve", "torchserve"),
        ("bucketed bs16 on standalone", "standalone", "standalone"),
        ("dynamic bs16", "torchserve", "torchserve"),
        ("dynamic bs16 on standalone", "standalone", "standalone"),
    ]
    assert [r["host"] for r in json.loads((tmp_path / "results.json").read_text())][:2] == ["torchserve", "standalone"]
    report = (tmp_path / "report.md").read_text()
    assert "## Hosts: standalone against torchserve" in report
    assert "| torchserve req/s | standalone req/s | standalone / torchserve req/s |" in report
    assert "| bucketed bs16 | longtail, closed 32 clients | 100.0 | 200.0 | 2.00 |" in report
    # within a host only: bucketed on standalone against dynamic on standalone, never against TorchServe's dynamic
    comparisons = report.split("## Comparisons")[1].split("##")[0]
    assert "bucketed bs16 on standalone ran 1.00x the throughput of dynamic bs16 on standalone" in comparisons
    assert "bucketed bs16 on standalone ran 2.00x the throughput of dynamic bs16," not in comparisons
    assert "![batching_comparison.svg](batching_comparison.svg)" in report
    assert "on standalone" in (tmp_path / "batching_comparison.svg").read_text()


def test_one_host_alone_has_no_host_section(tmp_path):
    fake_run(tmp_path, ("torchserve",), CONFIGS[:1])
    report = (tmp_path / "report.md").read_text()
    assert "## Hosts" not in report
    assert "| config | server | engine |" in report  # the results table as before


def test_a_third_host_is_one_module_and_one_line(tmp_path):
    """A new host: an object with NAME and target (a module in bench/hosts/), one line in the registry."""
    fake_run(tmp_path, ("torchserve", "standalone", "rayserve"), CONFIGS[:1])
    report = (tmp_path / "report.md").read_text()
    assert "## Hosts: standalone against torchserve" in report and "## Hosts: rayserve against torchserve" in report
    assert "| rayserve / torchserve p99 |" in report


def test_host_comparisons_pair_the_same_configuration_on_the_baseline_host():
    def summary(config: Configuration, rps: float) -> stats.Summary:
        return stats.Summary(config, 10, 10, 1.0, rps, 0, 1.0, 1.0, 1.0, 1.0)

    base = Configuration("bucketed", 16)
    alone = replace(base, host="standalone")
    other = replace(base, batch_size=8, host="standalone")  # its TorchServe twin did not run
    pairs = stats.host_comparisons([summary(base, 10), summary(alone, 12), summary(other, 9)])
    assert [(c.a.config, c.b.config) for c in pairs] == [(alone, base)]
    assert pairs[0].throughput_ratio == pytest.approx(1.2)
    # without TorchServe, the first host measured is the baseline
    assert stats.baseline_host([summary(alone, 1), summary(replace(base, host="rayserve"), 1)]) == "standalone"


def test_the_bulk_section_names_the_host_when_another_ran():
    from bench.kinds import bulk

    row = bulk.BulkRow("bucketed bs16", TORCHSERVE, "same", 64, 1, 64, 2, 32, 0.5, 1, 2, 2.0, 10, 1.0, 0)
    assert "| host |" not in bulk.section([row])
    both = bulk.section([row, replace(row, config="bucketed bs16 on standalone", host="standalone")])
    assert "| config | host | bulk requests to |" in both and "| bucketed bs16 on standalone | standalone |" in both


def test_hosts_registry_modules_have_what_a_host_needs():
    for name, host in hosts.HOSTS.items():
        assert host.NAME == name and callable(host.target)


def test_the_report_header_names_the_hosts_where_another_ran():
    from bench.harness.results import run_header

    assert "hosts" not in run_header([], plan(SMALL))
    both = run_header([], plan([*SMALL, "--hosts", "torchserve,standalone"]))
    assert both["hosts"] == "torchserve, standalone (each configuration on each, in turn)"
