"""TorchServe control: the HTTP client and keys (`client`), the process lifecycle (`process`), the handler in
process as a worker runs it (`inprocess`), and the CLI behind `make serve/stop/token/status` (`python -m tsctl`)."""

from .client import Client, Endpoints, KeyFile, Reply, ServerError, free_ports, port_in_use, read_properties, request
from .identity import group_cpu_seconds
from .process import TorchServe
from .signals import exit_on_signals

__all__ = [
    "Client",
    "Endpoints",
    "KeyFile",
    "Reply",
    "ServerError",
    "TorchServe",
    "exit_on_signals",
    "free_ports",
    "group_cpu_seconds",
    "port_in_use",
    "read_properties",
    "request",
]
