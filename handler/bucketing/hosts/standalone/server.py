"""uvicorn around the app, with our SIGTERM: stop admitting (503 + Retry-After), answer what was admitted, exit 0.

uvicorn's own handling would close the listener at once (new clients refused, not told to retry) and re-raise the
signal after shutdown (exit status 143, not 0); here the first SIGTERM or SIGINT starts the app's drain, and the
server stops once the drain is done and newcomers stopped coming (`App.drain`), or the drain's time passed (the
grace period less what closing connections needs, `App.drain_s`), so the process exits within
`Settings.grace_period_s`; a second SIGINT forces the exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from bucketing.hosts.standalone.app import SHUTDOWN_S, App

logger = logging.getLogger("bucketing.hosts.standalone")


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signals drain the app first."""

    def __init__(self, config: uvicorn.Config, app: App) -> None:
        super().__init__(config)
        self.app = app
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if not self.should_exit:
            asyncio.create_task(self._watch_loading())

    async def _watch_loading(self) -> None:
        if not await self.app.loaded():  # a model that cannot be opened: say why and exit 1
            self.exit_code = 1
            self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None:
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        if self._loop is None:  # before the loop runs: nothing admitted yet
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._begin_drain, sig)

    def _begin_drain(self, sig: int) -> None:
        if self._drain is None:
            logger.info("%s: draining (new requests get 503), then exiting", signal.Signals(sig).name)
            self._drain = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        answered = await self.app.drain()
        if not answered:
            logger.warning("drain: requests still unanswered after %g s; exiting", self.app.drain_s)
        else:
            logger.info("drain: every admitted request answered")
        self.should_exit = True


def run(app: App, host: str, port: int, log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT (drained) or a model fails to open; the exit status."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level=log_level,
        access_log=False,  # the app logs one JSON line per request
        timeout_graceful_shutdown=int(SHUTDOWN_S) - 1,  # the drain answered every request: only idle connections
        server_header=False,
    )
    server = DrainingServer(config, app)
    server.run()
    return server.exit_code


__all__ = ["DrainingServer", "run"]
