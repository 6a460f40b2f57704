"""`arbiter serve --config FILE`: the file, the command line over it, one-line errors naming the
key, and docs/configuration.md generated from the model."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpu_arbiter.cli import serve_config
from gpu_arbiter.cli.serve import serve
from gpu_arbiter.cli.serve_config import NOT_CONFIG, ServeConfig, resolve
from gpu_arbiter.control.launch import ServerProcess
from gpu_arbiter.domain import InvalidInput
from tests.control.harness import ADMIN

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ServeConfig().model_dump()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "arbiter.toml"
    path.write_text(text)
    return path


def test_every_serve_option_is_a_config_key_with_the_same_default():
    params = {
        name: p.default
        for name, p in inspect.signature(serve).parameters.items()
        if name not in NOT_CONFIG and name != "ctx"
    }
    assert set(params) == set(ServeConfig.model_fields)
    assert {n: ServeConfig.model_fields[n].default for n in params} == params


def test_the_file_sets_what_the_command_line_does_not(tmp_path):
    path = write(
        tmp_path,
        'db = "data/arbiter.db"\nport = 9000\ntier2-grace = 60\nstate-dir = "state"\n'
        'reports = "/srv/reports"\nlog-level = "info"\n',
    )
    got = resolve(path, {**DEFAULTS, "port": 9100}, given={"port"})
    assert got.port == 9100  # the command line wins
    assert got.tier2_grace == 60.0 and got.log_level == "info"
    assert got.db == str(tmp_path / "data" / "arbiter.db")  # relative to the file
    assert got.state_dir == tmp_path / "state"
    assert got.reports == Path("/srv/reports")
    assert got.host == "127.0.0.1"  # in neither: the default


def test_a_database_url_is_kept_as_written(tmp_path):
    path = write(tmp_path, 'db = "postgresql://arbiter@db.internal/arbiter"\n')
    assert resolve(path, DEFAULTS, set()).db == "postgresql://arbiter@db.internal/arbiter"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("polcy = 'fifo'\n", "unknown key 'polcy' (did you mean 'policy'?)"),
        ("tier2_grace = 5\n", "unknown key 'tier2_grace' (did you mean 'tier2-grace'?)"),
        ("port = 70000\n", "arbiter.toml: port: Input should be less than or equal to 65535"),
        ("min-grace = -1\n", "arbiter.toml: min-grace: Input should be greater than or equal"),
        ("backend = 'nomad'\n", "arbiter.toml: backend: Input should be 'local', 'slurm'"),
        ("policy = 'best'\n", "arbiter.toml: policy: Value error, unknown policy 'best'"),
        ("port = \n", "arbiter.toml: not valid TOML: Invalid value (at line 1, column 8)"),
    ],
)
def test_a_bad_file_is_refused_in_one_line_naming_the_key(tmp_path, text, message):
    with pytest.raises(InvalidInput) as e:
        resolve(write(tmp_path, text), DEFAULTS, set())
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_command_line_value_names_the_option_not_the_file(tmp_path):
    path = write(tmp_path, "port = 9000\n")
    with pytest.raises(InvalidInput, match="^--heartbeat-timeout: Input should be greater"):
        resolve(path, {**DEFAULTS, "heartbeat_timeout": 0.0}, {"heartbeat_timeout"})


def test_the_reference_page_is_current():
    """Regenerate with `arbiter serve --print-config-reference > docs/configuration.md`."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == serve_config.reference_markdown()
    for name in ServeConfig.model_fields:
        assert f"| `{name.replace('_', '-')}` |" in page


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gpu_arbiter.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_serve_prints_the_reference():
    out = run_cli("serve", "--print-config-reference")
    assert out.returncode == 0, out.stderr
    assert out.stdout == serve_config.reference_markdown()


def test_serve_with_a_bad_file_exits_2_with_one_line(tmp_path):
    out = run_cli("serve", "--config", str(write(tmp_path, "heartbeat-timeout = 0\n")))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "heartbeat-timeout: Input should be greater than 0" in out.stderr
    assert not (tmp_path / "arbiter.db").exists()


def test_serve_runs_with_the_file_and_the_command_line_over_it(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "bench-out").mkdir()
    path = etc / "arbiter.toml"
    path.write_text('port = 1\nreports = "bench-out"\ncycle-interval = 0.05\n')
    server = ServerProcess(
        str(tmp_path / "a.db"), tmp_path / "state", ADMIN, extra=["--config", str(path)]
    )
    server.start()
    try:
        # Listening on the command line's port, not the file's; the reports folder is found
        # next to the file.
        page = httpx.get(server.url + "/reports").text
        assert f"No results.json found in {etc / 'bench-out'}" in page
    finally:
        server.stop()
        server.kill()
