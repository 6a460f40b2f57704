"""The agent loop: register the node, then a heartbeat with a health sample every interval.

A heartbeat that fails (server restarting) is retried at the next interval; if the server
forgot the node (a fresh database), the agent registers it again. `url` may list several
servers, comma-separated (a leader and its standbys): a request that cannot connect goes to the
next one, and the agent stays with the one that answered.
"""

from __future__ import annotations

import logging
import threading

import httpx

from gpu_arbiter.agent.discovery import GpuInventory, sample_health
from gpu_arbiter.domain import InvalidInput

log = logging.getLogger("gpu_arbiter.agent")


class Agent:
    def __init__(
        self,
        url: str,
        token: str,
        name: str,
        inventory: GpuInventory,
        rack: str = "rack0",
        interval_s: float = 5.0,
    ) -> None:
        self.name = name
        self.inventory = inventory
        self.rack = rack
        self.interval_s = interval_s
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def _send(self, method: str, path: str, body: dict) -> httpx.Response:
        """The request to the first server, in turn from the last one that answered, that
        takes the connection; the last connection error when none does."""
        for tried in range(1, len(self.urls) + 1):
            try:
                return self.http.request(method, self.urls[0] + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if tried == len(self.urls):
                    raise
                self.urls.append(self.urls.pop(0))
                log.warning("no answer from the server; trying %s", self.urls[0])
        raise InvalidInput("agent: no server URL given")

    def register(self) -> None:
        body = {
            "gpu_type": self.inventory.gpu_type,
            "gpus": self.inventory.count,
            "rack": self.rack,
        }
        r = self._send("PUT", f"/v1/nodes/{self.name}", body)
        r.raise_for_status()

    def beat(self) -> None:
        r = self._send(
            "POST", f"/v1/nodes/{self.name}/heartbeat", sample_health(self.inventory).to_json()
        )
        if r.status_code == 404:
            self.register()
            return
        r.raise_for_status()

    def run(self, stop: threading.Event) -> None:
        registered = False
        while not stop.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                    log.info(
                        "registered %s: %d x %s",
                        self.name,
                        self.inventory.count,
                        self.inventory.gpu_type,
                    )
                else:
                    self.beat()
            except httpx.HTTPStatusError as e:
                if e.response.status_code in (401, 403, 422):
                    raise  # no retry mends a bad token or a refused inventory
                log.warning("server refused: %s %s", e.response.status_code, e.response.text)
            except httpx.HTTPError as e:
                log.warning("server unreachable: %s", e)
            stop.wait(self.interval_s)
        self.http.close()
