"""Named cluster presets and the YAML cluster format.

YAML format (every field but `racks` optional)::

    name: lab
    gpu_types:                      # extra or overridden GPU types
      - {name: H100, speed: 1.0, power_w: 700}
    racks:
      - name: r0
        pod: p0
        power_cap_kw: 40
        labels: [datasets-eu]       # data-locality labels (S5)
        nodes: 4                    # a count of identical nodes ...
        gpu_type: H100
        gpus_per_node: 8
        nvlink_domain: 8
      - name: r1
        nodes:                      # ... or an explicit list
          - {name: big-1, gpu_type: A100, gpus: 8}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_arbiter.domain.cluster import Cluster, GpuType, Node, Rack
from gpu_arbiter.domain.config_files import first_error, read_yaml_mapping
from gpu_arbiter.domain.errors import InvalidInput


def _grid(
    name: str,
    groups: list[tuple[str, int, int, int, float]],
    nodes_per_pod_racks: int = 32,
    node_idle_w: float = 1_000.0,
) -> Cluster:
    """A regular cluster from groups of (gpu_type, racks, nodes_per_rack, gpus, cap_kw)."""
    racks: list[Rack] = []
    nodes: list[Node] = []
    r = 0
    for gpu_type, n_racks, per_rack, gpus, cap_kw in groups:
        for _ in range(n_racks):
            rack = Rack(
                name=f"r{r:04d}", pod=f"pod{r // nodes_per_pod_racks}", power_cap_w=cap_kw * 1000
            )
            racks.append(rack)
            for k in range(per_rack):
                nodes.append(
                    Node(
                        name=f"{rack.name}-n{k:02d}",
                        gpu_type=gpu_type,
                        gpus=gpus,
                        rack=rack.name,
                        idle_power_w=node_idle_w,
                    )
                )
            r += 1
    return Cluster.build(name, nodes, racks)


def small() -> Cluster:
    """8 nodes × 8 H100 in 2 racks."""
    return _grid("small", [("H100", 2, 4, 8, 30)])


def medium() -> Cluster:
    """512 GPUs: 32 H100 nodes in 8 racks and 32 A100 nodes in 4 racks, 2 pods."""
    return _grid("medium", [("H100", 8, 4, 8, 30), ("A100", 4, 8, 8, 40)], nodes_per_pod_racks=6)


def large() -> Cluster:
    """100,000 GPUs of 4 types in racks of 8 nodes × 8 GPUs (60 kW liquid-cooled racks)."""
    return _grid(
        "large",
        [
            ("H100", 782, 8, 8, 60),  # 50,048 GPUs
            ("H200", 312, 8, 8, 60),  # 19,968
            ("A100", 313, 8, 8, 45),  # 20,032
            ("B200", 156, 8, 8, 80),  # 9,984
        ],
    )


PRESETS = {"small": small, "medium": medium, "large": large}


class _NodeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    gpu_type: str
    gpus: int = Field(ge=0, le=64)
    nvlink_domain: int = Field(default=0, ge=0)
    idle_power_w: float = Field(default=1000.0, gt=0)
    labels: list[str] = []
    numa_nodes: int = Field(default=2, ge=1)
    nvme_tb: float = Field(default=0.0, ge=0)


class _RackModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    pod: str = "pod0"
    power_cap_kw: float = Field(default=40.0, gt=0)
    labels: list[str] = []
    nodes: int | list[_NodeModel]
    gpu_type: str | None = None
    gpus_per_node: int = Field(default=8, ge=0, le=64)
    nvlink_domain: int = Field(default=0, ge=0)


class _GpuTypeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    speed: float = Field(default=1.0, gt=0)
    power_w: float = Field(default=700.0, gt=0)
    memory_gib: int = Field(default=80, gt=0)


class _ClusterModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "cluster"
    gpu_types: list[_GpuTypeModel] = []
    racks: list[_RackModel] = Field(min_length=1)


def cluster_from_dict(data: Any, source: str = "cluster") -> Cluster:
    try:
        model = _ClusterModel.model_validate(data)
    except ValidationError as e:
        raise first_error(source, e) from None
    racks, nodes = [], []
    for rm in model.racks:
        labels = frozenset(rm.labels)
        racks.append(
            Rack(name=rm.name, pod=rm.pod, power_cap_w=rm.power_cap_kw * 1000, labels=labels)
        )
        if isinstance(rm.nodes, int):
            if rm.gpu_type is None:
                raise InvalidInput(
                    f"{source}: racks.{rm.name}.gpu_type is required with a node count"
                )
            nodes += [
                Node(
                    name=f"{rm.name}-n{k:02d}",
                    gpu_type=rm.gpu_type,
                    gpus=rm.gpus_per_node,
                    rack=rm.name,
                    nvlink_domain=rm.nvlink_domain,
                    labels=labels,
                )
                for k in range(rm.nodes)
            ]
        else:
            nodes += [
                Node(
                    name=nm.name,
                    gpu_type=nm.gpu_type,
                    gpus=nm.gpus,
                    rack=rm.name,
                    nvlink_domain=nm.nvlink_domain,
                    idle_power_w=nm.idle_power_w,
                    labels=labels | frozenset(nm.labels),
                    numa_nodes=nm.numa_nodes,
                    nvme_tb=nm.nvme_tb,
                )
                for nm in rm.nodes
            ]
    types = [GpuType(**t.model_dump()) for t in model.gpu_types]
    return Cluster.build(model.name, nodes, racks, types)


def load_cluster_yaml(path: str | Path) -> Cluster:
    data = read_yaml_mapping(path, "cluster file", expected="a mapping with 'racks'")
    return cluster_from_dict(data, source=f"cluster file {path}")


def resolve_cluster(name_or_path: str) -> Cluster:
    """A preset name (`small`, `medium`, `large`) or a path to a YAML cluster file."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]()
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).exists():
        return load_cluster_yaml(name_or_path)
    raise InvalidInput(
        f"unknown cluster {name_or_path!r}: use one of {', '.join(PRESETS)} or a YAML file"
    )
