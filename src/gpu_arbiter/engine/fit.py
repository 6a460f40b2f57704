"""Which GPU types of the cluster a job can run on, and how fast.

A job accepts the types its spec names (or any, at the type's own speed), but can only ever be
placed on one whose NVLink domains hold its tensor-parallel groups and whose largest gang
(within its `max_racks`) holds its smallest size. `TypeFit` answers that once per job and
type, orders the types fastest for the job first, and refuses at submission a job that fits
no type at all. These are facts of the cluster's shape, not of what runs on it."""

from __future__ import annotations

from gpu_arbiter.domain import Cluster, InvalidInput, Job
from gpu_arbiter.engine.capacity import CapacityIndex


class TypeFit:
    """The GPU types a job can run on, fastest first, and the faster ones a running job
    could move to (cached per job)."""

    def __init__(self, cluster: Cluster, index: CapacityIndex) -> None:
        self.cluster = cluster
        self.index = index
        self._max_gang: dict[tuple[str, int | None], int] = {}
        self._faster: dict[str, tuple[str, list[str]]] = {}  # see faster_types
        self._max_domain: dict[str, int] = {}
        for n in cluster.nodes:
            if n.gpus:
                self._max_domain[n.gpu_type] = max(
                    self._max_domain.get(n.gpu_type, 0), n.domain_size
                )

    def speed(self, job: Job, gpu_type: str) -> float | None:
        return job.spec.speed_on(gpu_type, self.cluster.gpu_types[gpu_type].speed)

    def types_by_speed(self, job: Job) -> list[str]:
        """Accepted GPU types of this cluster the job can run on, fastest for the job first."""
        types = job.types
        if types is None:
            types = job.types = sorted(
                (t for t in self.index.max_size if self.runs_on(job.spec, t)),
                key=lambda t: (-self.speed(job, t), t),
            )
        return types

    def faster_types(self, job: Job) -> list[str]:
        """The accepted types on which the running job would run faster than where it runs,
        fastest first (engine.migration looks at every running job each cycle). It depends
        only on the job and the type it runs on (its speed there is the type's for it), so it
        is worked out once per job and type, not at every start: a job that is suspended and
        restarted again and again (Gavel's rounds) gets it from the cache."""
        here = job.allocation.gpu_type
        hit = self._faster.get(job.id)
        if hit is None or hit[0] != here:
            faster = [t for t in self.types_by_speed(job) if self.speed(job, t) > job.speed]
            hit = self._faster[job.id] = (here, [t for t in faster if t != here])
        return hit[1]

    def forget(self, job_id: str) -> None:
        """The job ended (finished or cancelled): it will not start again."""
        self._faster.pop(job_id, None)

    def runs_on(self, spec, gpu_type: str) -> bool:
        """Whether a job accepts `gpu_type` and could ever be placed on it: its tp groups fit
        the type's NVLink domains and its smallest size the type's largest gang."""
        if spec.speed_on(gpu_type, 1.0) is None or self._max_domain[gpu_type] < spec.tp_size:
            return False
        return self.max_gang(gpu_type, spec.max_racks) >= spec.elastic_range[0]

    def max_gang(self, gpu_type: str, max_racks: int | None) -> int:
        key = (gpu_type, max_racks)
        if key not in self._max_gang:
            self._max_gang[key] = self.cluster.max_gang(gpu_type, max_racks)
        return self._max_gang[key]

    def check_fits(self, spec) -> None:
        """Refuse (InvalidInput) a job that no type of this cluster can ever run."""
        accepted = [t for t in self.index.max_size if spec.speed_on(t, 1.0) is not None]
        if not accepted:
            wanted = ", ".join(spec.gpu_types) or "any"
            have = ", ".join(self.index.max_size)
            raise InvalidInput(
                f"job {spec.id!r} accepts GPU types {wanted}; the cluster has {have}"
            )
        need = spec.elastic_range[0]
        best = max(self.max_gang(t, spec.max_racks) for t in accepted)
        if need > best:
            within = f" within {spec.max_racks} rack(s)" if spec.max_racks else ""
            raise InvalidInput(
                f"job {spec.id!r} needs {need} GPUs but at most {best} GPUs of its accepted "
                f"types exist{within}"
            )
        if spec.tp_size > max(self._max_domain[t] for t in accepted):
            raise InvalidInput(
                f"job {spec.id!r}: tp_size {spec.tp_size} is larger than any NVLink domain"
            )
