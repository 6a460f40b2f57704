"""Circuit breakers and stragglers on a live server (F5, issue 45): every telemetry report goes
through the simulator's breakers; a trip stops or flags the job under the team's policy and the
team is told (reason, audit, metrics, webhook); a node whose ranks hold a gang back is marked
degraded and the gang restarts without it."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.control.harness import Cluster, database, start_server, wait_for

_names = itertools.count()


class Receiver:
    """A webhook receiver on 127.0.0.1: keeps every JSON body posted to it. With `hang`, it
    holds each request until closed (a receiver that never answers)."""

    def __init__(self, hang: bool = False) -> None:
        self.bodies: list[dict] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.bodies.append(json.loads(body))
                if hang:
                    outer.release.wait(30)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def site(db, tmp_path_factory) -> Iterator[Cluster]:
    """A server with three 8-GPU nodes that marks a straggler at once (window 0) and trips the
    I/O-stall breaker after one second of I/O wait over the limit."""
    state = tmp_path_factory.mktemp("state")
    windows = ("--straggler-window", "0", "--io-stall-window", "1")
    server = start_server(db, state, "--min-grace", "1", *windows)
    c = Cluster(server)
    try:
        for name in ("na", "nb", "nc"):
            c.node(name, 8)
        yield c
    finally:
        c.close()
        server.close()


@pytest.fixture(autouse=True)
def _cancel_leftovers(site) -> Iterator[None]:
    """Each test starts on an idle cluster: what a test left running is cancelled."""
    yield
    for j in site.admin.get("/v1/jobs", params={"state": "active"}).json():
        site.admin.post(f"/v1/jobs/{j['id']}/cancel")


def team(c: Cluster, **settings: object) -> tuple[str, httpx.Client]:
    """A team with breaker settings (`breaker_policy`, `webhook_url`) and a client of it."""
    name = f"b{next(_names)}"
    client = c.team(name)
    if settings:
        r = c.admin.put(f"/v1/teams/{name}", json={"quota": {"H100": 0}, **settings})
        assert r.status_code == 200, r.text
    return name, client


def running(
    c: Cluster, client: httpx.Client, gpus: int = 1, command: str = "sleep 60", **body: object
) -> dict:
    r = client.post("/v1/jobs", json={"command": command, "gpus": gpus, **body})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    return wait_for(lambda: (j := c.job(job_id))["state"] == "running" and j)


def report(client: httpx.Client, job_id: str, **data: object) -> httpx.Response:
    return client.post(f"/v1/jobs/{job_id}/telemetry", json=data)


def audit(c: Cluster, job_id: str) -> list[dict]:
    rows = c.admin.get("/v1/audit", params={"limit": 100000}).json()
    return [e for e in rows if e["subject"] == job_id]


def metric(c: Cluster, name: str, **labels: str) -> float:
    text = c.admin.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    line = f"{name}{{{want}}}" if want else name
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    return 0.0


def test_telemetry_numbers_are_strict_and_nan_is_said_explicitly(site):
    _, client = team(site)
    job = running(site, client)
    raw = {"content": None, "headers": {"Content-Type": "application/json"}}
    for body, field in (
        ('{"loss": Infinity}', "loss"),
        ('{"loss": NaN}', "loss"),
        ('{"grad_norm": 1e400}', "grad_norm"),
        ('{"loss": 1' + "0" * 400 + "}", "loss"),  # an integer no float can hold
        ('{"tokens_per_s": 1e400}', "tokens_per_s"),
        ('{"tokens_per_s": 1e30}', "tokens_per_s"),
        ('{"step": true}', "step"),
        ('{"loss": true}', "loss"),
        ('{"loss": "NaN!"}', "loss"),
        ('{"io_wait_share": 1.5}', "io_wait_share"),
        ('{"step_time_s": 0}', "step_time_s"),
    ):
        r = client.post(f"/v1/jobs/{job['id']}/telemetry", **{**raw, "content": body})
        assert r.status_code == 422, body
        assert f"body.{field}" in r.json()["detail"], r.text
    assert site.job(job["id"])["telemetry"] == {}  # nothing was taken
    assert report(client, job["id"], step=3, loss=1e300, grad_norm="inf").status_code == 200
    schema = site.admin.get("/openapi.json").json()["components"]["schemas"]["Telemetry"]
    assert "nan" in json.dumps(schema["properties"]["loss"])


def test_a_nan_loss_stops_the_job_and_releases_its_gpus(site):
    name, client = team(site)
    job = running(site, client, gpus=2, walltime_s=3600)
    before = metric(site, "arbiter_breaker_trips_total", breaker="non_finite", action="stop")
    saved_before = metric(site, "arbiter_breaker_saved_gpu_hours_total")
    assert report(client, job["id"], step=1233, loss=2.5).status_code == 200
    assert report(client, job["id"], step=1234, loss="nan").status_code == 200
    done = site.job(job["id"])
    assert done["state"] == "failed"
    assert done["reason"] == "circuit breaker: loss is NaN at step 1234"
    assert done["allocation"] is None
    assert any(e["action"] == "breaker-stop" for e in audit(site, job["id"]))
    after = metric(site, "arbiter_breaker_trips_total", breaker="non_finite", action="stop")
    assert after == before + 1
    # As the simulator counts it: the GPU time it would still have held, to its walltime.
    saved = metric(site, "arbiter_breaker_saved_gpu_hours_total") - saved_before
    assert 1.5 < saved <= 2.0
    # Its GPUs are free again: the team's next job starts.
    assert running(site, client, gpus=2)["state"] == "running"
    # Reports of a stopped job are refused.
    assert report(client, job["id"], step=1235, loss=1.0).status_code == 409


def test_a_stopped_job_without_walltime_saves_as_long_again_as_its_run_had_lasted(site):
    _, client = team(site)
    job = running(site, client, gpus=2)  # no walltime: how long it would have run is unknown
    saved_before = metric(site, "arbiter_breaker_saved_gpu_hours_total")
    time.sleep(1.0)  # it runs a while before its loss goes bad
    assert report(client, job["id"], step=7, loss="nan").status_code == 200
    done = site.job(job["id"])
    assert done["state"] == "failed"
    held = (done["finished_at"] - done["started_at"]) * 2 / 3600
    assert held > 0
    saved = metric(site, "arbiter_breaker_saved_gpu_hours_total") - saved_before
    assert saved == pytest.approx(held, rel=1e-6)
    (stop,) = [e for e in audit(site, job["id"]) if e["action"] == "breaker-stop"]
    assert stop["detail"]["saved_gpu_hours"] == pytest.approx(held, rel=1e-6)


def test_a_flag_policy_keeps_the_job_running_and_flagged(site, receiver):
    _, client = team(site, breaker_policy="flag", webhook_url=receiver.url)
    job = running(site, client)
    # A loss that diverges: 20 samples of warm-up at 1.0, then it grows.
    for step in range(20):
        assert report(client, job["id"], step=step, loss=1.0).status_code == 200
    for step in range(20, 40):
        report(client, job["id"], step=step, loss=10.0 ** (step - 19))
    now = site.job(job["id"])
    assert now["state"] == "running"
    assert now["reason"].startswith("flagged by circuit breaker: loss divergence")
    assert any(e["action"] == "breaker-flag" for e in audit(site, job["id"]))
    wait_for(lambda: receiver.bodies)
    assert f"job {job['id']} flagged; it keeps running" in receiver.bodies[0]["text"]


def test_io_wait_over_the_limit_for_the_window_stops_or_flags_the_job_by_team_policy(site):
    _, stopping = team(site)
    _, flagging = team(site, breaker_policy="flag")
    jobs = [(running(site, stopping, gpus=2), stopping), (running(site, flagging), flagging)]
    before = metric(site, "arbiter_breaker_trips_total", breaker="io_stall", action="stop")
    for job, client in jobs:
        for step, share in ((1, 0.5), (2, 0.05), (3, 0.4)):  # over, under, over again
            assert report(client, job["id"], step=step, io_wait_share=share).status_code == 200
        assert site.job(job["id"])["state"] == "running"  # not sustained yet
    time.sleep(1.1)  # the window passes with I/O wait still over the limit
    for job, client in jobs:
        assert report(client, job["id"], step=4, io_wait_share=0.4).status_code == 200
    (stopped, _), (flagged, _) = jobs
    done = site.job(stopped["id"])
    assert done["state"] == "failed" and done["allocation"] is None, done
    assert done["reason"].startswith("circuit breaker: I/O stall: I/O wait above 15% for ")
    assert done["reason"].endswith(" at step 4"), done["reason"]
    trips = [e for e in audit(site, stopped["id"]) if e["action"] == "breaker-stop"]
    assert [e["detail"]["breaker"] for e in trips] == ["io_stall"], trips
    after = metric(site, "arbiter_breaker_trips_total", breaker="io_stall", action="stop")
    assert after == before + 1
    still = site.job(flagged["id"])
    assert still["state"] == "running", still
    assert still["reason"].startswith("flagged by circuit breaker: I/O stall"), still["reason"]
    flags = [e for e in audit(site, flagged["id"]) if e["action"] == "breaker-flag"]
    assert [e["detail"]["breaker"] for e in flags] == ["io_stall"], flags


def test_a_webhook_that_never_answers_does_not_hold_up_the_loop(site):
    hung = Receiver(hang=True)
    try:
        _, client = team(site, webhook_url=hung.url)
        first = running(site, client)
        assert report(client, first["id"], step=5, grad_norm="inf").status_code == 200
        wait_for(lambda: hung.bodies)  # the sender now waits on the receiver
        # Meanwhile the loop goes on: a second trip, a new job starting.
        second = running(site, client)
        assert report(client, second["id"], step=6, loss="-inf").status_code == 200
        assert site.job(second["id"])["state"] == "failed"
        assert running(site, client)["state"] == "running"
    finally:
        hung.close()


def test_a_team_sets_its_breaker_policy_and_webhook(site):
    name, _ = team(site, breaker_policy="flag", webhook_url="https://hooks.example.com/T0/B0")
    rows = {t["name"]: t for t in site.admin.get("/v1/teams").json()}
    assert rows[name]["breaker_policy"] == "flag"
    assert rows[name]["webhook_url"] == "https://hooks.example.com/T0/B0"
    for bad in ({"breaker_policy": "explode"}, {"webhook_url": "ftp://x"}):
        r = site.admin.put(f"/v1/teams/{name}", json=bad)
        assert r.status_code == 422 and list(bad)[0] in r.json()["detail"]


def test_a_straggling_node_is_marked_degraded_and_the_gang_moves_off_it(site, receiver):
    _, client = team(site, webhook_url=receiver.url)
    job = running(site, client, gpus=16)
    nodes = sorted(job["allocation"]["nodes"])
    assert len(nodes) == 2
    fast, slow = nodes
    # A job speaks only for the nodes it runs on: it cannot get another node marked degraded.
    (other,) = {"na", "nb", "nc"} - set(nodes)
    r = report(client, job["id"], rank=0, node=other, step_time_s=9.0)
    assert r.status_code == 422 and r.json()["detail"].startswith("node: ")
    for rank in range(8):
        assert report(client, job["id"], rank=rank, node=fast, step_time_s=1.0).status_code == 200
    for rank in range(8, 16):
        report(client, job["id"], rank=rank, node=slow, step_time_s=2.0)
    state = {n["name"]: n for n in site.admin.get("/v1/nodes").json()}
    assert state[slow]["state"] == "degraded"
    assert state[slow]["reason"].startswith("straggler: its ranks took 2.0x")
    moved = wait_for(
        lambda: (j := site.job(job["id"]))["state"] == "running" and j["restarts"] == 1 and j
    )
    assert slow not in moved["allocation"]["nodes"]
    wait_for(lambda: receiver.bodies)
    assert f"node {slow} marked degraded" in receiver.bodies[0]["text"]
    # No new work on the degraded node, though all its GPUs are free: a job that would fit
    # there waits until the gang ends and then runs elsewhere.
    r = client.post("/v1/jobs", json={"command": "sleep 60", "gpus": 8})
    other = r.json()["id"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    started = wait_for(lambda: (j := site.job(other))["state"] == "running" and j)
    assert slow not in started["allocation"]["nodes"]
    # Taken back into service, it takes work again.
    assert site.admin.post(f"/v1/nodes/{slow}/uncordon").status_code == 200
    big = running(site, client, gpus=16)
    assert slow in big["allocation"]["nodes"]


def test_the_example_diverges_is_stopped_by_its_breaker_and_the_team_is_told(site, receiver):
    _, client = team(site, webhook_url=receiver.url)
    command = (
        f"{sys.executable} -m gpu_arbiter.examples.train_tiny --steps 100000 "
        "--step-time 0.02 --diverge-at 50 --backend numpy"
    )
    job = running(site, client, command=command)
    done = wait_for(lambda: (j := site.job(job["id"]))["state"] == "failed" and j, timeout_s=120)
    assert done["reason"].startswith("circuit breaker: "), done["reason"]
    wait_for(lambda: receiver.bodies)
    text = receiver.bodies[0]["text"]
    assert f"job {job['id']} stopped and its GPUs released: " in text
    assert set(receiver.bodies[0]) == {"text"}  # what a Slack incoming webhook takes


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_db(request, tmp_path):
    yield from database(request.param, tmp_path)


def test_a_restart_keeps_what_the_breakers_saw_of_a_running_job(fresh_db, tmp_path):
    state = tmp_path / "state"
    server = start_server(fresh_db, state, "--min-grace", "1")
    c = Cluster(server)
    try:
        c.node("n1", 8)
        _, client = team(c)
        token = client.headers["Authorization"].split()[1]
        job = running(c, client)
        for step in range(20):  # the divergence breaker's warm-up
            report(client, job["id"], step=step, loss=1.0)
        for step in range(20, 23):  # 3 of the 5 rising samples it waits for
            report(client, job["id"], step=step, loss=10.0 ** (step - 19))
        assert c.job(job["id"])["state"] == "running"
        c.close()
        server.kill()
        server = start_server(fresh_db, state, "--min-grace", "1")
        c = Cluster(server)
        client = server.client(token)
        assert c.job(job["id"])["state"] == "running"  # adopted
        for step in range(23, 25):
            assert report(client, job["id"], step=step, loss=10.0 ** (step - 19)).is_success
        done = c.job(job["id"])
        assert done["state"] == "failed"
        assert done["reason"].startswith("circuit breaker: loss divergence"), done["reason"]
        assert done["reason"].endswith("at step 24")
    finally:
        c.close()
        server.close()
