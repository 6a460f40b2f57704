"""Every mistake a user makes with `arbiter` is one line on stderr and exit code 2; the client
commands start without the server's and the simulator's libraries; help is plain click help."""

from __future__ import annotations

import importlib
import json
import os
import pty
import socket
import subprocess
import sys

import pytest

from gpu_arbiter.control.launch import ServerProcess, free_port

ARBITER = [sys.executable, "-m", "gpu_arbiter.cli"]


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ARBITER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
    )


def one_line_exit_2(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for word in words:
        assert word in out.stderr, out.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (("bogus",), ("No such command 'bogus'",)),
        (("simulate", "--polcy", "fifo"), ("--polcy", "Did you mean", "--policy")),
        (("simulate", "--seed", "abc"), ("--seed", "'abc' is not a valid integer")),
        (("teams", "frobnicate"), ("No such command 'frobnicate'",)),
        (("submit", "--gpus", "two", "--", "true"), ("--gpus",)),
        (("tokens", "create", "--team", "a", "--agent"), ("exactly one of",)),
        (("bill", "--from-sim", "out", "--url", "http://127.0.0.1:1"), ("not both",)),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(args, words):
    one_line_exit_2(run(*args, ARBITER_TOKEN="t"), *words)


def test_every_command_a_module_registers_is_listed_for_lazy_loading():
    """A command missing from `main.COMMANDS` would silently not exist."""
    import pkgutil

    import typer

    import gpu_arbiter.cli
    from gpu_arbiter.cli.main import COMMANDS

    for info in pkgutil.iter_modules(gpu_arbiter.cli.__path__):
        if info.name in ("main", "__main__"):
            continue
        module = importlib.import_module(f"gpu_arbiter.cli.{info.name}")
        if not hasattr(module, "register"):
            continue
        app = typer.Typer()
        module.register(app)
        group = typer.main.get_group(app)
        for name in group.commands:
            assert COMMANDS.get(name) == info.name, f"{name} of cli/{info.name}.py"


def test_an_unreachable_server_is_one_line_for_every_client_command():
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("queue",), ("teams",), ("tokens", "list"), ("nodes", "cordon", "n1")):
        one_line_exit_2(run(*args, ARBITER_URL=url, ARBITER_TOKEN="t"), "cannot reach", url)
    one_line_exit_2(run("bill", ARBITER_URL=url, ARBITER_TOKEN="t"), "cannot reach", url)


def test_no_token_says_where_the_admin_token_is():
    env = {k: v for k, v in os.environ.items() if k != "ARBITER_TOKEN"}
    out = subprocess.run([*ARBITER, "teams"], capture_output=True, text=True, timeout=120, env=env)
    one_line_exit_2(out, "ARBITER_TOKEN", "admin.token")


def test_version_and_help_are_plain():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("arbiter "), out
    for args in (("--help",), ("queue", "--help"), ("teams", "create", "--help")):
        text = run(*args).stdout
        assert "Usage: arbiter" in text
        assert "<str>" not in text and "<bool>" not in text, text
    helps = run("submit", "--help").stdout
    assert "fewest GPUs" in helps and "most GPUs" in helps  # --min-gpus / --max-gpus


HEAVY = ("matplotlib", "fastapi", "sqlalchemy", "uvicorn", "numpy", "gpu_arbiter.sim")


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("queue",),
        ("submit", "--", "true"),
        ("cancel", "j1"),
        ("teams",),
        ("teams", "create", "x", "--quota", "H100=1"),
        ("tokens", "list"),
        ("nodes",),
        ("logs", "j1"),
    ],
)
def test_client_commands_load_neither_the_server_nor_the_simulator(args):
    """`arbiter queue` once imported matplotlib, FastAPI and the simulator: 2 s per call."""
    probe = (
        "import sys\n"
        "from gpu_arbiter.cli.main import main\n"
        f"sys.argv = ['arbiter', *{list(args)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print([m for m in sys.modules if m.startswith({HEAVY!r})])\n"
    )
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the command fails, fast
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ARBITER_URL": url, "ARBITER_TOKEN": "t"},
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", (out.stdout, out.stderr)


def test_serve_on_a_busy_port_says_so_before_serving(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run("serve", "--db", str(tmp_path / "a.db"), "--port", str(port),
                  "--state-dir", str(tmp_path / "state"))  # fmt: skip
    one_line_exit_2(out, f"127.0.0.1:{port}", "in use")
    assert "serving on" not in out.stderr and "admin token" not in out.stderr


def test_serve_with_an_unreachable_postgresql_is_one_line(tmp_path):
    db = f"postgresql://arbiter:secret@127.0.0.1:{free_port()}/arbiter"
    out = run("serve", "--db", db, "--port", str(free_port()), "--state-dir", str(tmp_path))
    one_line_exit_2(out, "cannot open the database", "Connection refused")
    assert "secret" not in out.stderr


def test_serve_makes_the_folder_of_a_new_sqlite_file(tmp_path):
    """The README's `arbiter serve --db sqlite:///out/arbiter.db` on a machine without out/."""
    db = tmp_path / "out" / "deeper" / "arbiter.db"
    server = ServerProcess(f"sqlite:///{db}", tmp_path / "state", "admin-token")
    try:
        server.start()
        assert server.client().get("/v1/teams").status_code == 200
    finally:
        server.stop()
        server.kill()
    assert db.is_file()


def test_simulate_shows_progress_on_a_terminal_and_not_in_a_pipe():
    args = ("simulate", "--workload", "synthetic:60", "--seed", "2", "--json")
    piped = run(*args)
    assert piped.returncode == 0 and "jobs finished" not in piped.stderr
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run(
            [*ARBITER, *args],
            stdout=subprocess.PIPE,
            stderr=secondary,
            stdin=subprocess.DEVNULL,
            timeout=120,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
        )
        os.close(secondary)
        secondary = -1
        screen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            screen += chunk
    finally:
        if secondary >= 0:
            os.close(secondary)
        os.close(primary)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["completed"] == 60  # stdout stays one JSON object
    assert b"jobs finished" in screen
