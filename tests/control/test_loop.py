"""The control loop without a server: when it wakes up between requests."""

from __future__ import annotations

import gc
import time

import pytest

from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.store import open_database
from tests.control.harness import NoBackend


@pytest.fixture
def loop(tmp_path):
    db = open_database(str(tmp_path / "a.db"))
    cfg = ServerConfig(state_dir=tmp_path, tick_s=60.0, cycle_interval_s=30.0)
    loop = ControlLoop(db, NoBackend(), cfg)  # type: ignore[arg-type]
    loop.load()
    loop.tick()
    yield loop
    db.dispose()


def test_a_loop_without_nodes_waits_a_whole_tick_between_wakeups(loop):
    """With no nodes there is no cycle to run, so a change must not make the loop spin (it did:
    a zero timeout on every wakeup until the first node registered, a whole core busy)."""
    assert loop.state.sched is None and loop.state.changed
    assert loop.next_tick_at() - time.time() > 30.0


def test_a_rebuild_is_ticked_at_once_but_a_plain_batch_waits_for_the_tick(loop):
    """A batch of commands is not followed by a tick unless one is due; a command that needs
    the engine rebuilt (a node or team change) gets it before the next batch."""
    assert time.time() < loop.next_tick_at()
    loop.state.rebuild = True
    assert loop.next_tick_at() == 0.0


def test_a_started_loop_keeps_its_loaded_state_out_of_full_collections(tmp_path):
    """Full passes of the garbage collector over a 100k-GPU cluster's state stall a cycle; the
    loop freezes what it loaded at start, and lets go of it when it stops."""
    db = open_database(str(tmp_path / "a.db"))
    loop = ControlLoop(db, NoBackend(), ServerConfig(state_dir=tmp_path))  # type: ignore[arg-type]
    loop.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        loop.stop()
        db.dispose()
    assert gc.get_freeze_count() == 0
