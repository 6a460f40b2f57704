"""What Slurm says about its nodes and jobs, parsed into plain data.

Pure functions over the text of `scontrol show node -o`, `scontrol show -d job`,
`scontrol show topology`, `sinfo` and `squeue`, so the parsing is tested without a cluster and
the backend (`slurm.py`) only runs commands. Racks come from the leaf switches of Slurm's own
topology (`topology/tree`): a leaf switch is a rack in Arbiter's tree (S5); without topology
every node is in rack `rack0`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_arbiter.domain import GPU_CATALOG

# Slurm node states (sinfo %T, lower case; `*` marks a node that does not respond) that make a
# node a fault for Arbiter. `draining` counts: Slurm admins and health checks drain a node
# because something is wrong with it, and Arbiter should move work off it rather than wait.
FAULT_STATES = frozenset(
    {"down", "drained", "draining", "drain", "fail", "failing", "maint", "unknown", "no_respond"}
)

_GRES = re.compile(r"gpu(?::(?P<type>[^:(,]+))?:(?P<count>\d+)")
_IDX = re.compile(r"gpu(?::[^:(,]+)?:\d+\(IDX:(?P<idx>[^)]*)\)")
_JOB_NODE = re.compile(r"^\s*Nodes=(?P<nodes>\S+) .*?GRES=(?P<gres>\S+)", re.M)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as Arbiter needs it: its GPUs, its rack, and whether Slurm calls it healthy."""

    name: str
    gpu_type: str
    gpus: int
    rack: str
    state: str
    reason: str

    @property
    def faulty(self) -> bool:
        return is_fault(self.state)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One line of `squeue`: Slurm's id (`123`, or `123+1` for a heterogeneous component)."""

    slurm_id: str
    state: str
    name: str
    nodes: str

    @property
    def base_id(self) -> str:
        return self.slurm_id.split("+", 1)[0]


def is_fault(state: str) -> bool:
    """`idle`, `mixed`, `allocated`, `completing` are healthy; `drained`, `down*`, `idle+drain`,
    `mixed*` (not responding) are not."""
    s = state.lower()
    if s.endswith("*") or "not_responding" in s:
        return True
    return any(part in FAULT_STATES for part in re.split(r"[+~#$@^-]", s.rstrip("*")) if part)


def arbiter_gpu_type(slurm_type: str) -> str:
    """Slurm's gres type (`h100`, `a100`) as Arbiter's catalog spells it (`H100`); a type the
    catalog does not know is kept upper-cased, and registration then names it."""
    for name in GPU_CATALOG:
        if name.lower() == slurm_type.lower():
            return name
    return slurm_type.upper()


def parse_fields(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value two` (scontrol's one-line form) into a dict. Values may contain
    spaces only for keys scontrol writes last (Reason=...), which is all we read."""
    fields: dict[str, str] = {}
    key = None
    for token in line.split():
        if "=" in token and re.match(r"^[A-Za-z_/:]+=", token):
            key, _, value = token.partition("=")
            fields[key] = value
        elif key is not None:
            fields[key] += " " + token
    return fields


def parse_nodes(
    scontrol_nodes: str, racks: Mapping[str, str], partition: str | None = None
) -> list[SlurmNode]:
    """Nodes with at least one GPU (in `partition` when given) from `scontrol show node -o`."""
    out: list[SlurmNode] = []
    for line in scontrol_nodes.splitlines():
        f = parse_fields(line)
        name = f.get("NodeName")
        if not name:
            continue
        if partition is not None and partition not in f.get("Partitions", "").split(","):
            continue
        gres = _GRES.search(f.get("Gres", ""))
        if gres is None or int(gres["count"]) == 0:
            continue
        reason = f.get("Reason", "")
        reason = "" if reason == "(null)" else reason
        out.append(
            SlurmNode(
                name=name,
                gpu_type=arbiter_gpu_type(gres["type"] or "gpu"),
                gpus=int(gres["count"]),
                rack=racks.get(name, "rack0"),
                state=f.get("State", "UNKNOWN").lower(),
                reason=reason,
            )
        )
    return out


def parse_topology(text: str, expand: Callable[[str], list[str]]) -> dict[str, str]:
    """Node → leaf switch from `scontrol show topology` (`SwitchName=s1 Level=0 ... Nodes=...`).
    `expand` turns a Slurm hostlist (`node[1-4]`) into names (`scontrol show hostnames`)."""
    racks: dict[str, str] = {}
    for line in text.splitlines():
        f = parse_fields(line)
        if f.get("Level") == "0" and f.get("Nodes") and f.get("SwitchName"):
            for node in expand(f["Nodes"]):
                racks[node] = f["SwitchName"]
    return racks


def parse_squeue(text: str) -> list[SlurmJob]:
    """`squeue -h -o '%i|%T|%j|%N'` lines."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            jobs.append(SlurmJob(parts[0], parts[1].upper(), parts[2], parts[3]))
    return jobs


def parse_job_gpus(scontrol_job: str, expand: Callable[[str], list[str]]) -> dict[str, tuple]:
    """GPU indices per node that Slurm gave a job, from `scontrol show -d job` (the
    `Nodes=node1 CPU_IDs=0 Mem=1000 GRES=gpu:h100:2(IDX:0-1)` lines; one job or all the
    components of a heterogeneous job)."""
    out: dict[str, tuple[int, ...]] = {}
    for m in _JOB_NODE.finditer(scontrol_job):
        idx = _IDX.search(m["gres"])
        if idx is None:
            continue
        gpus = tuple(_expand_ints(idx["idx"]))
        for node in expand(m["nodes"]):
            out[node] = tuple(sorted(set(out.get(node, ())) | set(gpus)))
    return out


def parse_exit_code(scontrol_job: str) -> int | None:
    """`ExitCode=rc:signal` → rc, or minus the signal when a signal ended the job."""
    m = re.search(r"\bExitCode=(\d+):(\d+)", scontrol_job)
    if m is None:
        return None
    rc, sig = int(m[1]), int(m[2])
    return -sig if sig else rc


def _expand_ints(spec: str) -> list[int]:
    """`0-1,4` → [0, 1, 4]."""
    out: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
