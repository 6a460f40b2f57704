"""A built wheel installs into a fresh virtual environment and gives a working `arbiter`.

The wheel is built from this checkout as `pip wheel .` builds it; its dependencies come from
the environment running the tests (a `.pth` file points the fresh one at it after the wheel is
installed without them), so the test needs no downloads but the build backend and checks the
package itself: its modules, its data files, its entry point and its declared requirements.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT)
    (built,) = out.glob("gpu_arbiter-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_installs_and_arbiter_runs(wheel, tmp_path):
    env = tmp_path / "fresh"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    sh(py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel)
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    arbiter = env / "bin" / "arbiter"
    assert sh(arbiter, "--version", cwd=tmp_path).strip() == f"arbiter {version('gpu-arbiter')}"
    helps = sh(arbiter, "--help", cwd=tmp_path)
    for command in ("simulate", "serve", "submit", "teams", "tokens", "prices", "nodes"):
        assert command in helps
    where = sh(py, "-c", "import gpu_arbiter; print(gpu_arbiter.__file__)", cwd=tmp_path)
    assert where.startswith(str(env)), where  # the wheel's copy, not this checkout's
    sh(arbiter, "simulate", "--workload", "synthetic:20", "--json", cwd=tmp_path)


def test_the_wheel_carries_the_dashboard_and_examples_and_declares_its_extras(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for part in ("web/templates/", "web/static/", "examples/train_tiny.py", "py.typed"):
        assert any(part in n for n in names), part
    extras = {
        line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Provides-Extra")
    }
    assert {"postgres", "slurm", "kubernetes", "torch-example"} <= extras


def test_the_declared_ranges_hold_the_versions_the_tests_run_on(wheel):
    """Every requirement (and those of the extras the tests use) admits what is installed."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    for line in meta.decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        marker = req.marker
        if marker is not None and not any(
            marker.evaluate({"extra": extra}) for extra in ("", "postgres", "dev")
        ):
            continue
        assert req.specifier.contains(version(req.name), prereleases=True), (req, version(req.name))
