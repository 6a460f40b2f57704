"""Run Arbiter's decisions as Kubernetes pods, through the official `kubernetes` client.

A `Start` becomes one pod per chosen node: required node affinity to exactly that node
(`kubernetes.io/hostname`), a `nvidia.com/gpu` request and limit of the GPUs chosen there, and
the gang's identity on every pod — the `scheduling.x-k8s.io/pod-group` label that the
coscheduling plugin (scheduler-plugins) and Volcano-style schedulers read, plus the gang size as
an annotation — so a gang-aware scheduler binds all of them or none (S3). Bare pods with
`restartPolicy: Never`, not Jobs: a Job controller would recreate a pod Arbiter deleted to
preempt it, and restarts are Arbiter's decision (F2).

Which GPU indices: the device plugin picks the devices of a `nvidia.com/gpu` request, as Slurm
does for gres; the count per node is enforced, Arbiter's indices travel as the `arbiter.io/gpus`
annotation for the record.

Stopping deletes the pods with `gracePeriodSeconds` = the grace (tier 3: 0, killed at once;
tier 2: the tier's notice, SIGTERM first); the stop is reported once the pods are gone. When one
pod of a gang fails the others are deleted: a gang lives and dies together.

After a control-plane restart the pods still running are taken back (a gang with any pod
running, whole); a job whose pods all ended meanwhile is answered by `outcome` from their status
(the kubelet's exit codes and end times), and its pods are deleted only once the server has
recorded that end (`forget`), so a crash in between cannot turn a finished job into one to run
again.

Nodes: GPU nodes (allocatable `nvidia.com/gpu` > 0); one that is not Ready or is cordoned
(`spec.unschedulable`) is a fault (`NodeDown`), and `NodeUp` when it is back. The GPU type is
read from GPU feature discovery's `nvidia.com/gpu.product` label, the rack from `arbiter.io/rack`
or `topology.kubernetes.io/zone`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.backends.slurm_inventory import SlurmNode
from gpu_arbiter.domain import (
    GPU_CATALOG,
    ArbiterError,
    Event,
    InvalidInput,
    JobFinished,
    JobStopped,
)
from gpu_arbiter.domain.events import JobFailed, NodeDown, NodeUp

log = logging.getLogger("gpu_arbiter.backends.kubernetes")

GPU = "nvidia.com/gpu"
MANAGED = "app.kubernetes.io/managed-by"
JOB_LABEL = "arbiter.io/job"
POD_GROUP = "scheduling.x-k8s.io/pod-group"
GANG_SIZE = "arbiter.io/gang-size"
GPUS_ANNOTATION = "arbiter.io/gpus"
ENDED = ("Succeeded", "Failed")  # pod phases no container runs in again (restartPolicy Never)


class KubernetesError(ArbiterError):
    """The API server refused or could not be reached."""


# The inventory record is the same shape for every executor.
KubeNode = SlurmNode


@dataclass(slots=True)
class _Job:
    job_id: str
    pods: list[str]
    nodes: tuple[str, ...]
    stopping: bool = False
    seen: set[str] = field(default_factory=set)


class KubernetesBackend:
    name = "kubernetes"

    def __init__(
        self,
        core: Any,
        namespace: str,
        image: str,
        state_dir: str | Path,
        poll_interval_s: float = 2.0,
        default_grace_s: float = 7200.0,
    ) -> None:
        """`core` is a `kubernetes.client.CoreV1Api`."""
        if poll_interval_s < 0 or default_grace_s < 0:
            raise InvalidInput("kubernetes backend: poll interval and grace must be >= 0")
        self.core = core
        self.namespace = namespace
        self.image = image
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.poll_interval_s = poll_interval_s
        self.default_grace_s = default_grace_s
        self._jobs: dict[str, _Job] = {}
        # Pods of runs that ended while no control plane watched, kept to say how (`outcome`)
        # until the server has recorded it (`forget`).
        self._ended: dict[str, list[Any]] = {}
        self._events: list[Event] = []
        self._node_fault: dict[str, bool] = {}
        self._last_query = -float("inf")
        self._adopt()

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None,
        namespace: str,
        image: str,
        state_dir: str | Path,
        default_grace_s: float = 7200.0,
    ) -> KubernetesBackend:
        """Credentials from `kubeconfig`, else the pod's service account, else ~/.kube/config."""
        from kubernetes import client, config

        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        return cls(client.CoreV1Api(), namespace, image, state_dir, default_grace_s=default_grace_s)

    # -- the Backend interface -------------------------------------------------------------

    def start(self, placement: Placement) -> None:
        if not placement.gpus_by_node:
            raise InvalidInput(f"kubernetes backend: job {placement.job_id} has no nodes")
        self.forget(placement.job_id)  # an earlier run's pods hold the names the new ones take
        manifests = pod_manifests(placement, self.namespace, self.image, self.default_grace_s)
        names = []
        for m in manifests:
            self._call(self.core.create_namespaced_pod, self.namespace, m)
            names.append(m["metadata"]["name"])
        self._jobs[placement.job_id] = _Job(placement.job_id, names, tuple(placement.gpus_by_node))

    def stop(self, job_id: str, grace_s: float) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.stopping:
            return
        job.stopping = True
        self._delete(job, grace_s)

    def resize(self, placement: Placement) -> None:
        """Pods cannot change GPUs: delete them at once and create the new gang."""
        job = self._jobs.pop(placement.job_id, None)
        if job is not None:
            self._delete(job, 0.0)
        self.start(placement)

    def poll(self) -> list[Event]:
        now_mono = time.monotonic()
        if now_mono - self._last_query >= self.poll_interval_s:
            self._last_query = now_mono
            try:
                self._poll_pods(time.time())
                self._poll_nodes(time.time())
            except KubernetesError as e:
                log.warning("kubernetes poll failed, will retry: %s", e)
        events, self._events = self._events, []
        return events

    def running(self) -> list[Running]:
        return [Running(j.job_id, j.nodes) for j in self._jobs.values() if not j.stopping]

    def outcome(self, job_id: str, since: float, alive_at: float | None = None) -> Event | None:
        """How a job whose pods ended while no control plane watched ended (asked after a
        restart), at its real end as the kubelet recorded it in the pods' status (which the job
        cannot write): failed with the first failed pod's exit code, or finished when every pod
        of the gang succeeded. None when no pod of the run that began at `since` is left (they
        were deleted or garbage-collected, or the pods found are an earlier run's)."""
        pods = self._ended.get(job_id)
        if not pods:
            return None
        ends = [t for t in map(_finished_at, pods) if t is not None]
        if not ends or max(ends) < since:
            return None
        at = min(max(ends), time.time())
        failed = [p for p in pods if p.status and p.status.phase == "Failed"]
        if failed:
            return JobFailed(job_id, at, _exit_code(failed[0]))
        size = int(((pods[0].metadata.annotations or {}).get(GANG_SIZE)) or len(pods))
        if len(pods) == size and all(p.status and p.status.phase == "Succeeded" for p in pods):
            return JobFinished(job_id, at)
        return None

    def forget(self, job_id: str) -> None:
        """The server has recorded how the job ended while it was away: keep its log and delete
        its pods (until then they are the only record of that end)."""
        pods = self._ended.pop(job_id, None)
        if pods:
            job = _Job(job_id, [p.metadata.name for p in pods], ())
            self._delete(job, 0.0)

    def log_path(self, job_id: str) -> Path:
        """The first pod's log, fetched from the API server when the job ends."""
        return self.dir / f"{job_id}.log"

    def shutdown(self) -> None:
        """Forget the pods without deleting them: they outlive a control-plane restart."""
        self._jobs.clear()

    def inventory(self) -> list[KubeNode]:
        nodes = self._call(self.core.list_node).items
        out = []
        for n in nodes:
            gpus = int((n.status.allocatable or {}).get(GPU, "0") or 0)
            if gpus <= 0:
                continue
            labels = n.metadata.labels or {}
            fault, reason = _node_health(n)
            out.append(
                KubeNode(
                    name=n.metadata.name,
                    gpu_type=gpu_type_from_product(labels.get("nvidia.com/gpu.product", "")),
                    gpus=gpus,
                    rack=_rack(labels),
                    state="down" if fault else "idle",  # Slurm's words, as KubeNode reads them
                    reason=reason,
                )
            )
        return out

    # -- internals -------------------------------------------------------------------------

    def _poll_pods(self, now: float) -> None:
        if not self._jobs:
            return
        pods = self._call(
            self.core.list_namespaced_pod, self.namespace, label_selector=f"{MANAGED}=arbiter"
        ).items
        by_job: dict[str, list[Any]] = {}
        for pod in pods:
            by_job.setdefault((pod.metadata.labels or {}).get(JOB_LABEL, ""), []).append(pod)
        for job in list(self._jobs.values()):
            mine = [p for p in by_job.get(job.job_id, []) if p.metadata.name in job.pods]
            phases = [p.status.phase if p.status else "Pending" for p in mine]
            failed = [p for p, ph in zip(mine, phases, strict=True) if ph == "Failed"]
            if job.stopping:
                if not mine:
                    self._end(job, JobStopped(job.job_id, now))
            elif failed:
                self._delete(job, 0.0)
                self._end(job, JobFailed(job.job_id, now, _exit_code(failed[0])))
            elif len(mine) == len(job.pods) and all(ph == "Succeeded" for ph in phases):
                self._delete(job, 0.0)
                self._end(job, JobFinished(job.job_id, now))
            elif not mine:
                self._end(job, JobFailed(job.job_id, now, -1))  # deleted behind our back

    def _end(self, job: _Job, event: Event) -> None:
        del self._jobs[job.job_id]
        self._events.append(event)

    def _save_log(self, job: _Job) -> None:
        try:
            text = self._call(self.core.read_namespaced_pod_log, job.pods[0], self.namespace)
        except KubernetesError:
            return
        self.log_path(job.job_id).write_text(text if isinstance(text, str) else str(text))

    def _poll_nodes(self, now: float) -> None:
        for n in self._call(self.core.list_node).items:
            if int((n.status.allocatable or {}).get(GPU, "0") or 0) <= 0:
                continue
            name = n.metadata.name
            fault, reason = _node_health(n)
            if self._node_fault.get(name) == fault:
                continue
            self._node_fault[name] = fault
            if fault:
                self._events.append(NodeDown(name, now, f"kubernetes: node {name} {reason}"))
            else:
                self._events.append(NodeUp(name, now))

    def _delete(self, job: _Job, grace_s: float) -> None:
        self._save_log(job)
        for name in job.pods:
            try:
                self._call(
                    self.core.delete_namespaced_pod,
                    name,
                    self.namespace,
                    grace_period_seconds=int(grace_s),
                    propagation_policy="Background",
                )
            except KubernetesError as e:
                if "404" not in str(e):
                    log.warning("deleting pod %s failed: %s", name, e)

    def _adopt(self) -> None:
        """Take over the pods a previous control plane created (their labels say whose)."""
        try:
            pods = self._call(
                self.core.list_namespaced_pod, self.namespace, label_selector=f"{MANAGED}=arbiter"
            ).items
        except KubernetesError as e:
            log.warning("kubernetes: cannot list pods to adopt: %s", e)
            return
        by_job: dict[str, list[Any]] = {}
        for pod in pods:
            job_id = (pod.metadata.labels or {}).get(JOB_LABEL)
            if job_id:
                by_job.setdefault(job_id, []).append(pod)
        for job_id, mine in by_job.items():
            if all(p.status and p.status.phase in ENDED for p in mine):
                self._ended[job_id] = mine  # ended while away: see `outcome`
                continue
            # A gang with a pod still running is taken back whole: `poll` then sees a pod
            # that failed meanwhile, or the last one to succeed.
            names = [p.metadata.name for p in mine]
            nodes = tuple(p.spec.node_name or "" for p in mine)
            self._jobs[job_id] = _Job(job_id, names, nodes)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise KubernetesError(f"{e.status} {e.reason}: {e.body}") from e
        except HTTPError as e:
            raise KubernetesError(str(e)) from e


def pod_manifests(
    p: Placement, namespace: str, image: str, default_grace_s: float = 7200.0
) -> list[dict[str, Any]]:
    """The gang's pods, one per node, as plain manifests (what `kubectl apply` would take)."""
    group = pod_name(p.job_id, None)
    grace = 0 if p.tier >= 3 else int(default_grace_s)
    env = {**p.env, "ARBITER_JOB_ID": p.job_id, "ARBITER_BACKEND": "kubernetes"}
    env["ARBITER_ALLOCATION"] = ";".join(
        f"{n}:{','.join(str(g) for g in gs)}" for n, gs in p.gpus_by_node.items()
    )
    out = []
    for rank, (node, gpus) in enumerate(p.gpus_by_node.items()):
        labels = {MANAGED: "arbiter", JOB_LABEL: _label(p.job_id), POD_GROUP: group}
        if p.team:
            labels["arbiter.io/team"] = _label(p.team)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name(p.job_id, rank),
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": {
                        GANG_SIZE: str(len(p.gpus_by_node)),
                        GPUS_ANNOTATION: ",".join(str(g) for g in gpus),
                        "arbiter.io/tier": str(p.tier),
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": grace,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "job",
                            "image": image,
                            "command": ["/bin/sh", "-c", p.command],
                            "env": [
                                {"name": k, "value": v}
                                for k, v in {**env, "ARBITER_RANK": str(rank)}.items()
                            ],
                            "resources": {
                                "requests": {GPU: str(len(gpus))},
                                "limits": {GPU: str(len(gpus))},
                            },
                        }
                    ],
                },
            }
        )
    return out


def pod_name(job_id: str, rank: int | None) -> str:
    """A DNS-1123 name: `arbiter-<job>` for the gang, `arbiter-<job>-<rank>` for its pods."""
    base = "arbiter-" + re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    base = base[:55].rstrip("-")
    return base if rank is None else f"{base}-{rank}"


def gpu_type_from_product(product: str) -> str:
    """`NVIDIA-H100-80GB-HBM3` → `H100`: the longest catalog name in the product string."""
    up = product.upper()
    hits = [name for name in GPU_CATALOG if re.search(rf"(^|[^A-Z0-9]){name}([^0-9]|$)", up)]
    return max(hits, key=len) if hits else (product or "gpu").upper()


def _label(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63].strip("-_.") or "x"


def _rack(labels: Mapping[str, str]) -> str:
    rack = labels.get("arbiter.io/rack") or labels.get("topology.kubernetes.io/zone") or "rack0"
    return _label(rack)


def _node_health(node: Any) -> tuple[bool, str]:
    """(faulty, reason): a node is a fault when it is not Ready or is cordoned."""
    if node.spec is not None and node.spec.unschedulable:
        return True, "cordoned (spec.unschedulable)"
    for c in node.status.conditions or []:
        if c.type == "Ready":
            if c.status != "True":
                return True, f"not Ready: {c.reason or c.message or c.status}"
            return False, ""
    return True, "no Ready condition"


def _finished_at(pod: Any) -> float | None:
    """When the pod's last container terminated (epoch seconds), as the kubelet reported it."""
    ends = [
        cs.state.terminated.finished_at
        for cs in ((pod.status.container_statuses or []) if pod.status else [])
        if cs.state and cs.state.terminated and cs.state.terminated.finished_at
    ]
    return max(ends).timestamp() if ends else None


def _exit_code(pod: Any) -> int:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        term = cs.state.terminated if cs.state else None
        if term is not None and term.exit_code:
            return int(term.exit_code)
    return -1
