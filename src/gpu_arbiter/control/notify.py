"""Telling a team: POSTs to its webhook from a background thread, never from the control loop.

A team may set a webhook URL (a Slack incoming webhook, or anything that takes the same body,
`{"text": "..."}`). The control loop only puts a message on a bounded queue, after the
transaction that decided it has committed; one daemon thread sends them, each with a timeout.
A receiver that is down, slow or wrong costs that thread its timeout and a log line, and a
full queue drops the newest message (counted), so the scheduling loop never waits on a
webhook. A message is a courtesy on top of what is durable: the job's reason and the audit log.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client import Counter

log = logging.getLogger("gpu_arbiter.control.notify")

_STOP = None


@dataclass(frozen=True, slots=True)
class Message:
    url: str
    text: str


class Webhooks:
    def __init__(
        self,
        sent: Counter | None = None,
        timeout_s: float = 5.0,
        max_queued: int = 1000,
    ) -> None:
        """`sent` counts messages by outcome (`sent`, `failed`, `dropped`)."""
        self.timeout_s = timeout_s
        self._sent = sent
        self._queue: queue.Queue[Message | None] = queue.Queue(maxsize=max_queued)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drain, name="arbiter-webhooks", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the sender; messages still queued after `timeout_s` are not sent."""
        if self._thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout=timeout_s)
        self._thread = None

    def send(self, url: str, text: str) -> None:
        """Queue `text` for `url`; never blocks."""
        try:
            self._queue.put_nowait(Message(url, text))
        except queue.Full:
            log.warning("webhook queue full; dropped a message for %s", url)
            self._count("dropped")

    def _drain(self) -> None:
        while True:
            msg = self._queue.get()
            if msg is _STOP:
                return
            try:
                self._post(msg)
                self._count("sent")
            except (urllib.error.URLError, OSError, ValueError) as e:
                log.warning("webhook %s failed: %s", msg.url, e)
                self._count("failed")

    def _post(self, msg: Message) -> None:
        req = urllib.request.Request(
            msg.url,
            data=json.dumps({"text": msg.text}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            resp.read(1024)

    def _count(self, outcome: str) -> None:
        if self._sent is not None:
            self._sent.labels(outcome).inc()
