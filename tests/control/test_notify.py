"""Team webhooks go out from their own thread: a slow or failing receiver, or a full queue,
never blocks the caller."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.notify import Webhooks


def test_a_message_is_posted_as_slack_json_and_a_failure_is_counted():
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    metrics = Metrics()
    hooks = Webhooks(metrics.webhooks, timeout_s=2.0)
    hooks.start()
    try:
        hooks.send("http://127.0.0.1:9/closed", "lost")  # nothing listens on the discard port
        hooks.send(f"http://127.0.0.1:{server.server_port}/hook", "job j1 stopped")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        hooks.stop()
        server.shutdown()
        server.server_close()
    assert got == [{"text": "job j1 stopped"}]
    assert metrics.webhooks.labels("failed")._value.get() == 1
    assert metrics.webhooks.labels("sent")._value.get() == 1


def test_a_full_queue_drops_the_message_instead_of_waiting():
    metrics = Metrics()
    hooks = Webhooks(metrics.webhooks, max_queued=2)  # not started: nothing drains it
    for i in range(5):
        hooks.send("http://127.0.0.1:9/x", f"m{i}")
    assert metrics.webhooks.labels("dropped")._value.get() == 3
