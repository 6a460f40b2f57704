"""A leader that is gone and a standby that answers, for the clients that fail over between the
servers of a URL list (the agent, the SDK): the first URL refuses connections, the second
records every PUT and POST it is sent and answers each with `{}`."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer


@dataclass
class Failover:
    urls: str  # "dead,live", as ARBITER_URL or an agent's --url lists them
    live_port: int
    got: list[tuple[str, str, bytes]] = field(default_factory=list)  # (method, path, body)


@contextmanager
def dead_then_live() -> Iterator[Failover]:
    """The two servers, stopped on leaving the block."""
    got: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.command, self.path, body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_PUT  # noqa: N815

        def log_message(self, *args):
            pass

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_port
        urls = f"http://127.0.0.1:{dead.getsockname()[1]},http://127.0.0.1:{port}"
        yield Failover(urls, port, got)
    finally:
        server.shutdown()
        dead.close()
