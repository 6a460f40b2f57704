"""`arbiter serve --log-level info` says what the scheduler did, not only what was submitted:
preemptions, failures, nodes going down, requeues (issue 45 item 9)."""

from __future__ import annotations

import logging
import time

from gpu_arbiter.control.store import open_database
from gpu_arbiter.domain.events import JobFailed
from tests.control.direct import ADMIN, Executor, call, new_loop, setup, submit, tick


def test_info_logs_preemptions_failures_node_downs_and_requeues(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpu_arbiter.control")
    executor = Executor()
    db = open_database(str(tmp_path / "a.db"))
    loop = new_loop(db, tmp_path, executor)
    setup(loop, {"a": None, "b": None})
    low = submit(loop, "a", gpus=8, tier=3)
    tick(loop)
    high = submit(loop, "b", gpus=8, tier=1)
    tick(loop)
    tick(loop)
    assert high in executor.jobs
    executor.events.append(JobFailed(high, time.time(), 1))
    tick(loop)
    tick(loop)  # the tier-3 job runs again ...
    call(loop, loop.commands.node_state, ADMIN, "n1", False, "bad fan")  # ... until the node goes
    said = caplog.text
    assert f"preempt {low} by scheduler" in said
    assert f"failed {high} by scheduler (reason=exited with code 1" in said
    assert "node-cordoned n1" in said and "bad fan" in said
    assert f"requeue {low} by scheduler" in said
    assert "submit" not in said
    db.dispose()
