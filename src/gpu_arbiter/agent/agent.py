"""The agent loop: register the node, then a heartbeat with a health sample every interval.

A heartbeat that fails (server restarting) is retried at the next interval; if the server
forgot the node (a fresh database), the agent registers it again.
"""

from __future__ import annotations

import logging
import threading

import httpx

from gpu_arbiter.agent.discovery import GpuInventory, sample_health

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
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=10
        )

    def register(self) -> None:
        body = {
            "gpu_type": self.inventory.gpu_type,
            "gpus": self.inventory.count,
            "rack": self.rack,
        }
        r = self.http.put(f"/v1/nodes/{self.name}", json=body)
        r.raise_for_status()

    def beat(self) -> None:
        r = self.http.post(
            f"/v1/nodes/{self.name}/heartbeat", json=sample_health(self.inventory).to_json()
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
                log.warning("server refused: %s %s", e.response.status_code, e.response.text)
                if e.response.status_code in (401, 403, 422):
                    raise
            except httpx.HTTPError as e:
                log.warning("server unreachable: %s", e)
            stop.wait(self.interval_s)
        self.http.close()
