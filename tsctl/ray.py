"""Start and stop one local Ray cluster serving the Ray host (`make serve-ray`), as `standalone` does for the
standalone server: a pid file read without following links, a process signalled only through a pidfd opened before
its identity was checked, never a process group, and never `ray stop` (it would stop every Ray of this user).

The cluster is one head node, `ray start --head --block` (its own Ray temp folder, free ports, small object store),
run as our child: on SIGTERM it ends every Ray process it started (its raylet ends the workers and replicas), and
Ray's reaper ends them should it die. The application is `config/ray/serve.yaml` with this checkout's absolute paths
and the chosen port (written to `.tmp/ray/serve.yaml`), deployed by `serve run --non-blocking`.

A process is our Ray head only if it is what only ours is: a live `python -m ray.scripts.scripts start --head
--block` with `--temp-dir` our Ray folder, working in our folder.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .client import ServerError, free_ports, port_in_use
from .identity import argv, cwd_of, exe_name, state
from .ownfiles import open_own, refuse_symlinks, write_own
from .process import ROOT
from .served import ServedFolder

RAY_MODULE = "ray.scripts.scripts"
SERVE_DIR = ROOT / ".tmp" / "ray"
CONFIG = ROOT / "config" / "ray" / "serve.yaml"
DEFAULT_PORT = 8592  # beside `make serve` (8580-8584) and `make serve-standalone` (8590)
PID_FILE_BYTES = 96
OWN_PATHS = ("ray.pid", "ray.out", "key_file.json", "serve.yaml", "ray_auth_token")
OBJECT_STORE_BYTES = 200 * 1024 * 1024
# On SIGTERM a Ray head first marks its node draining (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, Ray's default 30 s) and
# waits for its raylet to go idle. Our head holds the Serve controller and the replicas, so it never goes idle and
# every stop waited out the whole 30 s; then the processes end, cutting what is in flight: hence `RayServe.drain`.
NODE_DRAIN_S = 5.0
DRAIN_MODULE = "bucketing.hosts.ray.drain"  # drains the ingress; exit 0: drained, 1: not all in time, 2: not reached
CONNECT_S = 90.0  # what the drain's driver may take beyond the drain (joining the cluster), then it is ended


def ray_temp_dir(workdir: Path) -> Path:
    """Ray's temp folder for the cluster of `workdir`: short (Ray's socket paths must fit 107 bytes), one per
    folder and user."""
    digest = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"bucketing-ray-{os.getuid()}-{digest}"


def is_our_ray(pid: int, workdir: Path) -> bool:
    """Whether `pid` is a live Ray head of ours: python running `-m ray.scripts.scripts start --head --block` with
    our Ray temp folder, in our folder."""
    args = argv(pid)
    if not args or state(pid) in (None, "Z") or not (exe_name(pid) or "").startswith("python"):
        return False
    if args[1:4] != ["-m", RAY_MODULE, "start"] or "--head" not in args or "--block" not in args:
        return False
    temp = str(ray_temp_dir(workdir))
    if not any(a == "--temp-dir" and i + 1 < len(args) and args[i + 1] == temp for i, a in enumerate(args)):
        return False
    return cwd_of(pid) == workdir.resolve()


def serve_config(
    base: dict[str, Any], archive: Path, name: str, port: int, key_file: Path | None, threads: int | None = None
) -> dict[str, Any]:
    """`config/ray/serve.yaml` for this machine: loopback on `port`, the archive and key file at absolute paths;
    deployments and autoscaling as shipped."""
    config: dict[str, Any] = yaml.safe_load(yaml.safe_dump(base))  # a deep copy
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    shipped = app["args"]["models"][0].get("name")
    model = {**app["args"]["models"][0], "model": str(archive.resolve()), "name": name}
    if threads is not None:
        model["threads"] = threads
    app["args"] = {**app["args"], "models": [model]}
    if key_file is None:
        app["args"].pop("key_file", None)
        app["args"]["no_auth"] = True
    else:
        app["args"]["key_file"] = str(key_file.resolve())
    for deployment in app.get("deployments", []):
        if deployment.get("name") == shipped:
            deployment["name"] = name
    return config


class RayServe(ServedFolder):
    """One local Ray cluster (a head node) serving the Ray host, in its own folder (pid file, log, key file, the
    application's config) and session."""

    NAME = "ray"
    PID_FILE_BYTES = PID_FILE_BYTES
    PORTS = 2  # the HTTP port, then the GCS port
    PROCESS = "the Ray head"
    SERVICE = "the Ray application"
    TAIL_LINES = 20
    POLL_S = 0.5

    def __init__(
        self,
        workdir: Path = SERVE_DIR,
        port: int = DEFAULT_PORT,
        num_cpus: int = 2,
        object_store_bytes: int = OBJECT_STORE_BYTES,
        node_drain_s: float = NODE_DRAIN_S,
    ) -> None:
        super().__init__(workdir, port)
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.node_drain_s = node_drain_s
        self.gcs_port: int | None = None

    def is_ours(self, pid: int) -> bool:
        return is_our_ray(pid, self.workdir)

    def adopt(self, ports: tuple[int, ...]) -> None:
        self.port, self.gcs_port = ports

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def auth_token(self) -> Path:
        """The cluster's own token (Ray's token authentication), not `~/.ray/auth_token` shared by every Ray."""
        return self.workdir / "ray_auth_token"

    def ray_env(self) -> dict[str, str]:
        """The environment of our Ray processes and drivers: our token, no usage stats, the head's drain on SIGTERM."""
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.auth_token)}
        drain = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": f"{self.node_drain_s:g}"}
        return {**os.environ, **auth, **drain, "RAY_USAGE_STATS_ENABLED": "0"}

    @property
    def temp_dir(self) -> Path:
        return ray_temp_dir(self.workdir)

    def start(
        self,
        archive: Path,
        name: str,
        auth: bool = True,
        threads: int | None = None,
        base: dict[str, Any] | None = None,
        timeout: float = 300.0,
    ) -> RayServe:
        """Start the head, deploy the application on `archive` as `name`, and wait until the model is ready; on any
        failure or interruption, stop what was launched."""
        if self.pid() is not None:
            raise ServerError(f"a Ray cluster from {self.workdir} is already running (pid {self.pid()})")
        self.clear_stale()
        if port_in_use(self.url):
            raise ServerError(f"{self.url} is already in use: stop what listens there or choose another port")
        self.workdir.mkdir(parents=True, exist_ok=True)
        refuse_symlinks(self.workdir, OWN_PATHS)
        gcs, client, agent = free_ports(3)
        self.gcs_port = gcs
        command = [sys.executable, "-m", RAY_MODULE, "start", "--head", "--block", "--port", str(gcs)]
        command += ["--node-ip-address", "127.0.0.1", "--num-cpus", str(self.num_cpus)]
        command += ["--object-store-memory", str(self.object_store_bytes), "--include-dashboard", "false"]
        command += ["--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent)]
        command += ["--min-worker-port", "0", "--max-worker-port", "0", "--disable-usage-stats"]
        command += ["--temp-dir", str(self.temp_dir)]
        env = self.ray_env()
        config = serve_config(
            base if base is not None else yaml.safe_load(CONFIG.read_text()),
            archive,
            name,
            self.port,
            self.key_file if auth else None,
            threads,
        )
        try:
            write_own(self.auth_token, secrets.token_hex(32).encode())
            with os.fdopen(open_own(self.log, os.O_APPEND), "ab") as out:
                self.process = subprocess.Popen(
                    command,
                    cwd=self.workdir,
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                )
            write_own(self.pid_file, f"{self.process.pid} {self.port} {gcs}\n".encode())
            write_own(self.workdir / "serve.yaml", yaml.safe_dump(config, sort_keys=False).encode())
            self._wait_gcs(timeout)
            self._deploy(env, timeout)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def drain(self, drain_s: float) -> bool:
        """Before `stop`: the ingress admits no more requests (503 with Retry-After) and answers those admitted,
        within `drain_s` (`python -m bucketing.hosts.ray.drain`, our own child, ended past its time); whether all
        were answered. The head's SIGTERM would cut them (docs/hosts/ray.md)."""
        if self.pid() is None:
            return True
        app = yaml.safe_load((self.workdir / "serve.yaml").read_text())["applications"][0]["name"]
        command = ["-m", DRAIN_MODULE, "--address", self.address, "--app", app, "--timeout", f"{drain_s:g}"]
        try:
            return self._driver(command, self.ray_env(), drain_s + CONNECT_S) == 0
        except subprocess.TimeoutExpired:
            return False

    def _wait_gcs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.alive_or_raise()
            with socket.socket() as s:
                s.settimeout(1.0)
                if s.connect_ex(("127.0.0.1", self.gcs_port or 0)) == 0:
                    return
            time.sleep(0.5)
        raise ServerError(f"the Ray head did not listen in {timeout:.0f} s; see {self.log}")

    def _deploy(self, env: dict[str, str], timeout: float) -> None:
        """`serve run --non-blocking` of our config on our cluster (the application outlives this driver)."""
        serve = ["-m", "ray.serve.scripts", "run", "--non-blocking", "--address", self.address]
        code = self._driver([*serve, str(self.workdir / "serve.yaml")], env, timeout)
        if code != 0:
            raise ServerError(f"serve run failed ({code}):\n{self.tail()}")

    def _driver(self, args: list[str], env: dict[str, str], timeout: float) -> int:
        """A Python driver of our cluster (`python ARGS`), our own child, its output to our log, ended past
        `timeout` (subprocess.TimeoutExpired); its exit status."""
        with os.fdopen(open_own(self.log, os.O_APPEND), "ab") as out:
            done = subprocess.run(
                [sys.executable, *args],
                cwd=self.workdir,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                env=env,
                timeout=timeout,
                check=False,
            )
        return done.returncode


__all__ = [
    "CONFIG",
    "DEFAULT_PORT",
    "NODE_DRAIN_S",
    "RAY_MODULE",
    "SERVE_DIR",
    "RayServe",
    "is_our_ray",
    "ray_temp_dir",
    "serve_config",
]
