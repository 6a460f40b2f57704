"""After a restart: what the database says is running against what the backend runs.

Three outcomes per job:

* `adopt`: running in both — the engine takes it back on its recorded GPUs;
* `lost`: running in the database but unknown to the backend (the process died while the
  control plane was down, or the crash came between committing a Start and launching it) — the
  job goes back to the queue, charged up to now, and starts again from its checkpoint;
* `orphans`: running in the backend but not in the database (cancelled, finished or never
  acknowledged before the crash) — the backend stops them at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_arbiter.backends.base import Running


@dataclass(frozen=True, slots=True)
class Reconciliation:
    adopt: tuple[str, ...]
    lost: tuple[str, ...]
    orphans: tuple[str, ...]


def reconcile(db_running: Iterable[str], backend_running: Iterable[Running]) -> Reconciliation:
    db = list(dict.fromkeys(db_running))
    seen = {r.job_id for r in backend_running}
    known = set(db)
    return Reconciliation(
        adopt=tuple(j for j in db if j in seen),
        lost=tuple(j for j in db if j not in seen),
        orphans=tuple(sorted(seen - known)),
    )
