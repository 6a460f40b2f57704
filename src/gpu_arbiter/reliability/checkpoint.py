"""F2: what a failure costs a job, and the hot spares that let it restart at once.

A *run segment* is a stretch of a job's life at one rate that began from saved progress: a
first start (progress 0), or a restart or resize from the last checkpoint. It may spend
`restore_s` loading that checkpoint first (GPUs held, no progress); after that it progresses at
`rate` and checkpoints every `checkpoint_interval_s` seconds of progress-making time. When it
fails, its progress falls back to the last checkpoint, or to where the segment began if none was
taken; that, and nothing else, is the lost work. A job that never checkpoints therefore loses all
the progress of the segment, which is all its progress, since it resumed from 0.

The checkpoint rule itself is `domain.checkpointed_s`, which `Job.saved_progress` (what the
engine uses) applies too; this adds the split of the GPU time into useful and lost for goodput
accounting of one segment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_arbiter.domain import Cluster, InvalidInput, Node, checkpointed_s


@dataclass(frozen=True, slots=True)
class LostWork:
    """How a segment ended. `kept_s` is the progress to resume from and `lost_s` the progress
    thrown away (reference seconds). `useful_wall_s` and `lost_wall_s` are the progress-making
    seconds that produced each (multiply by the GPUs held for GPU-seconds); restore time is in
    neither. `checkpoint_at` is when the kept progress was saved (the segment start when no
    checkpoint was taken in it)."""

    kept_s: float
    lost_s: float
    useful_wall_s: float
    lost_wall_s: float
    checkpoint_at: float


@dataclass(frozen=True, slots=True)
class RunSegment:
    """A job that resumed from saved progress `progress_at_start` at `started_at`, restores for
    `restore_s`, then makes `rate` reference seconds of progress per second.
    `checkpoint_interval_s` None means the job never checkpoints."""

    started_at: float
    rate: float
    progress_at_start: float
    checkpoint_interval_s: float | None
    restore_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rate", "progress_at_start", "restore_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise InvalidInput(f"run segment: {name} must be >= 0, got {value}")
        interval = self.checkpoint_interval_s
        if interval is not None and not (interval > 0 and math.isfinite(interval)):
            raise InvalidInput(f"run segment: checkpoint_interval_s must be > 0, got {interval}")

    def progress_at(self, at: float) -> float:
        """Progress reached at `at` (not all of it saved)."""
        return self.progress_at_start + self.rate * self._productive(at)

    def lost_work(self, at: float, saved: bool = False) -> LostWork:
        """How the segment ends at `at`: by a failure or a kill without a save (the default),
        or, with `saved`, by a save at `at` (a clean preemption or the job finishing), which
        keeps everything. A checkpoint due exactly at `at` counts as taken."""
        productive = self._productive(at)
        kept_wall = productive if saved else checkpointed_s(productive, self.checkpoint_interval_s)
        return LostWork(
            kept_s=self.progress_at_start + self.rate * kept_wall,
            lost_s=self.rate * (productive - kept_wall),
            useful_wall_s=kept_wall,
            lost_wall_s=productive - kept_wall,
            # Never past `at`: start + restore + kept can round one ulp beyond it.
            checkpoint_at=(
                min(at, self.started_at + self.restore_s + kept_wall)
                if kept_wall
                else self.started_at
            ),
        )

    def _productive(self, at: float) -> float:
        if not at >= self.started_at:
            raise InvalidInput(f"run segment: time {at} is before its start {self.started_at}")
        return max(0.0, at - (self.started_at + self.restore_s))


class SparePool:
    """Hot spare nodes held back from normal placement so a failed job restarts at once (F2).

    A spare that is taken runs the failed job. `give_back` accepts any node, so a driver may
    return the spare once the failed node is repaired, or keep the job where it is and make the
    repaired node the new spare.
    """

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._free: dict[str, Node] = {}
        for node in nodes:
            self.give_back(node)

    @classmethod
    def from_cluster(
        cls,
        cluster: Cluster,
        per_type: int | Mapping[str, int] | None = None,
        names: Iterable[str] | None = None,
    ) -> SparePool:
        """Reserve spares either by count (`per_type`: the same count for every GPU type, or a
        count by type) or by node `names`. Counted spares are the highest-index nodes of each
        type, the end of the last racks, so packing from the front keeps whole racks free."""
        if (per_type is None) == (names is None):
            raise InvalidInput("spare pool: give either per_type or names")
        if names is not None:
            return cls(cluster.node(n) for n in names)
        assert per_type is not None
        counts = (
            dict.fromkeys(cluster.gpus_by_type(), per_type)
            if isinstance(per_type, int)
            else dict(per_type)
        )
        chosen: list[Node] = []
        for gpu_type, count in counts.items():
            typed = [n for n in cluster.nodes if n.gpus and n.gpu_type == gpu_type]
            if not 0 <= count <= len(typed):
                raise InvalidInput(
                    f"spare pool: {count} spares of {gpu_type} asked, the cluster has "
                    f"{len(typed)} such nodes"
                )
            chosen.extend(typed[len(typed) - count :])
        return cls(chosen)

    def __len__(self) -> int:
        return len(self._free)

    def __contains__(self, node_name: object) -> bool:
        return node_name in self._free

    @property
    def free(self) -> tuple[Node, ...]:
        """Spares ready to take; placement must leave these nodes alone."""
        return tuple(self._free.values())

    def take(self, gpu_type: str, gpus: int) -> Node | None:
        """The free spare of `gpu_type` that best fits `gpus` GPUs (fewest GPUs, then lowest
        index), removed from the pool; None when there is none."""
        fits = [n for n in self._free.values() if n.gpu_type == gpu_type and n.gpus >= gpus]
        if not fits:
            return None
        best = min(fits, key=lambda n: (n.gpus, n.index))
        del self._free[best.name]
        return best

    def give_back(self, node: Node) -> None:
        """Make `node` a free spare."""
        if node.name in self._free:
            raise InvalidInput(f"spare pool: node {node.name!r} is already a free spare")
        if not node.gpus:
            raise InvalidInput(f"spare pool: node {node.name!r} has no GPUs")
        self._free[node.name] = node
