"""The control loop without a server: what it does between requests."""

from __future__ import annotations

from gpu_arbiter.control.loop import ControlLoop, ServerConfig
from gpu_arbiter.control.store import open_database


class _NoBackend:
    name = "none"

    def running(self) -> dict:
        return {}

    def poll(self) -> list:
        return []


def test_a_loop_without_nodes_waits_a_whole_tick_between_wakeups(tmp_path):
    """With no nodes there is no cycle to run, so a change must not make the loop spin (it did:
    a zero timeout on every wakeup until the first node registered, a whole core busy)."""
    db = open_database(str(tmp_path / "a.db"))
    loop = ControlLoop(db, _NoBackend(), ServerConfig(state_dir=tmp_path))  # type: ignore[arg-type]
    loop._load()
    assert loop.sched is None and loop._changed
    assert loop._timeout() == loop.cfg.tick_s
    db.dispose()
