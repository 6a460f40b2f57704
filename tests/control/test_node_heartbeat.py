"""`arbiter nodes` on Slurm: the executor's node poll is each healthy node's heartbeat, so the
HEARTBEAT column moves with it instead of staying at registration time (issue 45 item 9)."""

from __future__ import annotations

from sqlalchemy import select

from gpu_arbiter.backends.slurm import SlurmBackend, SlurmError
from gpu_arbiter.cli.serve import register_inventory
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.store import TABLES, open_database
from tests.control.direct import Clock
from tests.control.harness import NoBackend

# `scontrol show node -o` as Debian's slurm-wlm 22.05 prints it: node2 stopped answering Slurm's
# pings (`IDLE*`), login has no GPU.
SCONTROL_NODES = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.02 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=127.0.0.1 "
    "NodeHostName=node1 Version=22.05.8 OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC "
    "RealMemory=16000 AllocMem=0 FreeMem=11873 Sockets=8 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-12-07T08:01:12 "
    "SlurmdStartTime=2026-12-07T09:14:55 LastBusyTime=2026-12-07T12:02:31 "
    "CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
    "NodeName=node2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.00 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=127.0.0.2 "
    "NodeHostName=node2 Version=22.05.8 RealMemory=16000 AllocMem=0 FreeMem=N/A Sockets=8 "
    "Boards=1 State=IDLE* ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu BootTime=None SlurmdStartTime=None LastBusyTime=2026-12-07T12:02:31 "
    "CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=Not responding [slurm@2026-12-07T12:40:03]\n"
    "NodeName=login Arch=x86_64 CPUTot=2 Gres=(null) State=IDLE Partitions=login\n"
)


class RecordedSlurm(SlurmBackend):
    """The real backend reading recorded command output instead of running Slurm."""

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        if argv[:3] == ["scontrol", "show", "node"]:
            return SCONTROL_NODES
        if argv[0] == "squeue":
            return ""  # no jobs to adopt
        raise SlurmError(f"{argv[0]}: not recorded")  # e.g. no topology plugin


def test_each_node_poll_refreshes_the_heartbeat_of_every_node_slurm_calls_healthy(tmp_path):
    db = open_database(str(tmp_path / "a.db"))
    clock = Clock()
    loop = ControlLoop(db, NoBackend(), ServerConfig(state_dir=tmp_path), clock=clock)  # type: ignore[arg-type]
    slurm = RecordedSlurm(tmp_path / "jobs", partition="gpu")
    loop.start()
    try:
        register_inventory(loop, slurm)
        assert set(loop.state.nodes) == {"node1"}  # node2 does not answer Slurm, login has no GPU
        first = loop.state.nodes["node1"]["last_heartbeat"]
        clock.t = first + 10.0  # the next poll, 10 s later
        register_inventory(loop, slurm)
        assert loop.state.nodes["node1"]["last_heartbeat"] >= first + 10.0
        nodes = TABLES["nodes"]
        with db.connect() as conn:  # what `arbiter nodes` reads
            q = select(nodes.c.last_heartbeat).where(nodes.c.name == "node1")
            assert conn.execute(q).scalar() == loop.state.nodes["node1"]["last_heartbeat"]
    finally:
        loop.stop()
        db.dispose()
