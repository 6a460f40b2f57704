"""The README's "Try it" runs as written, so the README cannot drift from the commands.

The section has two shell blocks: terminal 1 starts the server, terminal 2 does everything a
newcomer does (teams, tokens, a node agent, jobs, the queue, a log, the bill). The test runs the
first block's command as the server (on a free port, which ARBITER_URL tells the second block)
and the second block with `bash -eu` (a shell as a user has it) in the same fresh folder, then
checks what the server holds.
Every other `arbiter ...` line of the README is parsed as the command line would parse it.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import click
import httpx
import pytest
import typer

from gpu_arbiter.cli.main import app
from gpu_arbiter.control.launch import free_port
from tests.control.harness import wait_for

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = Path(sys.executable).parent


def section(title: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\b.*?(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(0)


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def commands(block: str) -> list[str]:
    """The block's command lines, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = [shlex.split(line, comments=True) for line in joined.splitlines()]
    return [shlex.join(words) for words in lines if words]


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_try_it_runs_top_to_bottom(tmp_path):
    terminal1, terminal2 = shell_blocks(section("Try it"))[:2]
    (serve,) = commands(terminal1)
    assert serve.startswith("arbiter serve")
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "ARBITER_URL": f"http://127.0.0.1:{port}",
    }
    env.pop("ARBITER_TOKEN", None)
    server_log = (tmp_path / "serve.out").open("wb")
    server = subprocess.Popen(
        [*shlex.split(serve), "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    tour = None
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{env['ARBITER_URL']}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                assert server.poll() is None, (tmp_path / "serve.out").read_text()
                return False

        wait_for(up, timeout_s=120)
        tour = subprocess.Popen(
            ["bash", "-eu", "-c", terminal2],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        out, err = tour.communicate(timeout=300)
        assert tour.returncode == 0, (out[-3000:], err[-3000:])
        admin = (tmp_path / "arbiter-state" / "admin.token").read_text().strip()
        client = httpx.Client(
            base_url=env["ARBITER_URL"], headers={"Authorization": f"Bearer {admin}"}
        )
        teams = {t["name"]: t for t in client.get("/v1/teams").json()}
        assert {"vision", "nlp"} <= set(teams)
        assert teams["vision"]["quota"] == {"H100": 4}
        nodes = client.get("/v1/nodes").json()
        assert [(n["name"], n["gpus"]) for n in nodes] == [("node1", 8)]
        jobs = client.get("/v1/jobs").json()
        assert {j["team"] for j in jobs} == {"vision", "nlp"}
        assert any(j["state"] == "completed" for j in jobs), jobs
        assert "vision" in out and "Submitted job" in out
        bill = {b["team"]: b for b in client.get("/v1/bill").json()}
        assert bill["vision"]["credits_charged"] > 0
    finally:
        if tour is not None and tour.poll() is None:
            kill_group(tour)
        if tour is not None:
            kill_group(tour)  # the agent it started in the background
        kill_group(server)
        server_log.close()


def simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command of a shell line (split at ; | & && ||)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set(";&|"):
            out.append([])
        else:
            out[-1].append(token)
    return [words for words in out if words]


def test_every_arbiter_line_of_the_readme_parses():
    """Each `arbiter ...` command in the README's shell blocks names real commands and options
    with values of the right types (nothing is run)."""
    root = typer.main.get_command(app)
    seen = 0
    for block in shell_blocks(README.read_text()):
        for words in (w for line in commands(block) for w in simple_commands(line)):
            while words and re.fullmatch(r"[A-Za-z_]+=.*", words[0]):
                words = words[1:]  # NAME=value prefixes
            if words[:1] != ["arbiter"] or any("$" in w for w in words):
                continue
            try:
                _parse_down(root.make_context("arbiter", words[1:]))
            except click.exceptions.Exit:
                pass
            except click.UsageError as e:
                pytest.fail(f"README: `{shlex.join(words)}`: {e.format_message()}")
            seen += 1
    assert seen >= 10


def _parse_down(ctx: click.Context) -> None:
    """Parse each subcommand's arguments as click would before running it."""
    while isinstance(ctx.command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]  # the public name is deprecated in click 8.2
        if not rest:
            return
        name, cmd, args = ctx.command.resolve_command(ctx, rest)
        assert cmd is not None, name
        ctx = cmd.make_context(name, args, parent=ctx)
