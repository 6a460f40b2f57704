"""What GPUs a node has and how healthy they are: NVML when it is there, declared fakes else.

NVML (`nvidia-ml-py`, imported as `pynvml`) is optional: a laptop, a CI runner or the demo runs
with `--fake-gpus N --gpu-type T`, which reports N healthy GPUs of type T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_arbiter.domain import GPU_CATALOG, InvalidInput


@dataclass(frozen=True, slots=True)
class GpuInventory:
    gpu_type: str
    count: int
    source: str  # "nvml" or "fake"


@dataclass(frozen=True, slots=True)
class Health:
    """One sample, in the shape of the heartbeat body (`control.schemas.Heartbeat`)."""

    ecc_uncorrectable: int = 0
    temperature_c: float | None = None
    gpus_seen: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ecc_uncorrectable": self.ecc_uncorrectable}
        if self.temperature_c is not None:
            out["temperature_c"] = self.temperature_c
        if self.gpus_seen is not None:
            out["gpus_seen"] = self.gpus_seen
        return out


def discover(fake_gpus: int | None = None, gpu_type: str | None = None) -> GpuInventory:
    """Declared fake GPUs win; otherwise NVML must find at least one GPU."""
    if fake_gpus is not None:
        if not 1 <= fake_gpus <= 64:
            raise InvalidInput(f"--fake-gpus must be in 1..64, got {fake_gpus}")
        if gpu_type is None or gpu_type not in GPU_CATALOG:
            raise InvalidInput(
                f"--gpu-type must be one of {', '.join(GPU_CATALOG)} with --fake-gpus, "
                f"got {gpu_type!r}"
            )
        return GpuInventory(gpu_type, fake_gpus, "fake")
    nvml = _nvml()
    if nvml is None:
        raise InvalidInput(
            "no NVML here (pip install nvidia-ml-py) — use --fake-gpus N --gpu-type T"
        )
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise InvalidInput("NVML found no GPUs — use --fake-gpus N --gpu-type T")
    name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
    name = name.decode() if isinstance(name, bytes) else name
    return GpuInventory(gpu_type or catalog_type(name), count, "nvml")


def catalog_type(nvml_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; unknown names are refused so placement stays exact."""
    upper = nvml_name.upper()
    for t in sorted(GPU_CATALOG, key=len, reverse=True):
        if t in upper:
            return t
    raise InvalidInput(f"GPU {nvml_name!r} is not in the catalog; name it with --gpu-type")


def sample_health(inv: GpuInventory) -> Health:
    if inv.source == "fake":
        return Health(gpus_seen=inv.count)
    nvml = _nvml()
    assert nvml is not None
    ecc, hottest = 0, None
    count = nvml.nvmlDeviceGetCount()
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        try:
            ecc += nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        except nvml.NVMLError:
            pass  # ECC is not supported on every board
        t = float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        hottest = t if hottest is None else max(hottest, t)
    return Health(ecc_uncorrectable=ecc, temperature_c=hottest, gpus_seen=count)


_NVML: Any = None


def _nvml() -> Any:
    """pynvml, initialised once, or None where the library or the driver is missing."""
    global _NVML
    if _NVML is None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return None
        _NVML = pynvml
    return _NVML
