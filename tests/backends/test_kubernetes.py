"""The Kubernetes backend against the client's own schema and a fake API server that replays
responses in the shape real API servers return (tests/fixtures/k8s) and records every request,
so the tests assert what the client sent: node affinity, GPU requests, the gang's pod group,
the deletion grace."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="pip install 'gpu-arbiter[kubernetes]'")

from kubernetes import client  # noqa: E402

from gpu_arbiter.backends.base import Placement  # noqa: E402
from gpu_arbiter.backends.kubernetes import (  # noqa: E402
    GANG_SIZE,
    POD_GROUP,
    KubernetesBackend,
    gpu_type_from_product,
    pod_manifests,
)
from gpu_arbiter.domain import JobFinished, JobStopped  # noqa: E402
from gpu_arbiter.domain.events import JobFailed, NodeDown, NodeUp  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
NS = "arbiter"
GANG = Placement(
    "j42",
    "python train.py",
    {"gpu-a1": (0, 1, 2, 3), "gpu-a2": (4, 5)},
    "H100",
    env={"ARBITER_TIER": "2"},
    team="research",
    tier=2,
)


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeApiServer:
    """Pods in memory, nodes from the fixture; every request is kept in `requests`."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes = _fixture("nodes.json")
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                with fake.lock:
                    fake.requests.append((method, url.path, query, body))
                    self._reply(*fake.answer(method, url.path, query, body))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, query: dict, body: Any) -> tuple:
        pods = f"/api/v1/namespaces/{NS}/pods"
        if method == "GET" and path == "/api/v1/nodes":
            return 200, self.nodes
        if method == "POST" and path == pods:
            if body["metadata"]["name"] in self.pods:
                return 409, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "AlreadyExists",
                    "code": 409,
                    "message": f'pods "{body["metadata"]["name"]}" already exists',
                }
            pod = copy.deepcopy(body)
            pod["metadata"].update(uid=f"uid-{len(self.pods)}", resourceVersion="1")
            pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            self.pods[pod["metadata"]["name"]] = pod
            return 201, pod
        if method == "GET" and path == pods:
            selector = dict(
                s.split("=", 1) for s in query.get("labelSelector", [""])[0].split(",") if s
            )
            items = [
                p
                for p in self.pods.values()
                if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            return 200, {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": "2"},
                "items": items,
            }
        if path.startswith(pods + "/") and path.endswith("/log"):
            return 200, b"epoch 1 loss 2.1\n", "text/plain"
        if method == "DELETE" and path.startswith(pods + "/"):
            pod = self.pods.pop(path.rsplit("/", 1)[1], None)
            if pod is None:
                return 404, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": f'pods "{path.rsplit("/", 1)[1]}" not found',
                }
            pod["metadata"]["deletionTimestamp"] = "2025-05-02T10:05:00Z"
            return 200, pod
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}

    def set_status(self, name: str, fixture: str) -> None:
        with self.lock:
            self.pods[name]["status"] = _fixture(fixture)

    def sent(self, method: str, suffix: str = "") -> list[tuple]:
        return [r for r in self.requests if r[0] == method and r[1].endswith(suffix)]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    s = FakeApiServer()
    yield s
    s.httpd.shutdown()


@pytest.fixture
def backend(server: FakeApiServer, tmp_path: Path) -> KubernetesBackend:
    api = client.ApiClient(client.Configuration(host=server.url))
    return KubernetesBackend(
        client.CoreV1Api(api),
        NS,
        "python:3.11-slim",
        tmp_path,
        poll_interval_s=0.0,
        default_grace_s=600,
    )


def test_generated_pods_are_valid_v1_pods_with_no_field_the_schema_lacks():
    api = client.ApiClient()
    for manifest in pod_manifests(GANG, NS, "python:3.11-slim"):
        pod = api.deserialize(json.dumps(manifest), "V1Pod", "application/json")
        assert api.sanitize_for_serialization(pod) == manifest  # unknown fields would be lost


def test_each_pod_is_pinned_to_its_node_with_its_gpu_count_and_the_gang_group():
    pods = pod_manifests(GANG, NS, "img", default_grace_s=600)
    assert [p["metadata"]["name"] for p in pods] == ["arbiter-j42-0", "arbiter-j42-1"]
    for pod, (node, gpus) in zip(pods, GANG.gpus_by_node.items(), strict=True):
        term = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]
        assert term["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        ]
        res = pod["spec"]["containers"][0]["resources"]
        assert res["limits"] == res["requests"] == {"nvidia.com/gpu": str(len(gpus))}
        assert pod["metadata"]["labels"][POD_GROUP] == "arbiter-j42"
        assert pod["metadata"]["annotations"][GANG_SIZE] == "2"
        assert pod["spec"]["terminationGracePeriodSeconds"] == 600
        assert pod["spec"]["restartPolicy"] == "Never"


def test_tier3_pods_get_no_termination_grace():
    tier3 = Placement("e1", "sleep 1", {"gpu-a1": (0,)}, "H100", tier=3)
    assert pod_manifests(tier3, NS, "img")[0]["spec"]["terminationGracePeriodSeconds"] == 0


def test_start_creates_the_gang_and_all_pods_succeeding_is_reported_finished(server, backend):
    backend.start(GANG)
    created = server.sent("POST", "/pods")
    assert [b["metadata"]["name"] for *_, b in created] == ["arbiter-j42-0", "arbiter-j42-1"]
    assert created[0][3] == pod_manifests(GANG, NS, "python:3.11-slim", 600)[0]
    server.set_status("arbiter-j42-0", "pod-status-succeeded.json")
    server.set_status("arbiter-j42-1", "pod-status-running.json")
    assert not [e for e in backend.poll() if isinstance(e, JobFinished)]
    server.set_status("arbiter-j42-1", "pod-status-succeeded.json")
    assert [e.job_id for e in backend.poll() if isinstance(e, JobFinished)] == ["j42"]
    assert "loss 2.1" in backend.log_path("j42").read_text()


def test_preemption_deletes_every_pod_with_the_tiers_grace_and_reports_stopped(server, backend):
    backend.start(GANG)
    backend.stop("j42", 7200.0)
    deletes = server.sent("DELETE")
    assert [d[1].rsplit("/", 1)[1] for d in deletes] == ["arbiter-j42-0", "arbiter-j42-1"]
    for _, _, query, body in deletes:
        grace = query.get("gracePeriodSeconds", [None])[0] or (body or {}).get("gracePeriodSeconds")
        assert int(grace) == 7200
    assert [type(e) for e in backend.poll() if not isinstance(e, NodeDown | NodeUp)] == [JobStopped]


def test_one_failed_pod_fails_the_gang_with_its_exit_code_and_deletes_the_rest(server, backend):
    backend.start(GANG)
    server.set_status("arbiter-j42-1", "pod-status-failed.json")
    failed = [e for e in backend.poll() if isinstance(e, JobFailed)]
    assert [(e.job_id, e.exit_code) for e in failed] == [("j42", 3)]
    assert server.pods == {}


def test_gpu_nodes_come_from_the_api_and_a_not_ready_node_is_a_fault(server, backend):
    nodes = backend.inventory()
    assert [(n.name, n.gpu_type, n.gpus, n.rack, n.faulty) for n in nodes] == [
        ("gpu-a1", "H100", 8, "rack-a", False),
        ("gpu-a2", "H100", 8, "rack-a", True),
    ]
    events = backend.poll()
    assert [e.node for e in events if isinstance(e, NodeUp)] == ["gpu-a1"]
    down = [e for e in events if isinstance(e, NodeDown)]
    assert [e.node for e in down] == ["gpu-a2"] and "NodeStatusUnknown" in down[0].reason


def test_a_restarted_backend_adopts_the_pods_still_running(server, backend, tmp_path):
    backend.start(GANG)
    api = client.ApiClient(client.Configuration(host=server.url))
    again = KubernetesBackend(client.CoreV1Api(api), NS, "img", tmp_path / "again")
    assert [r.job_id for r in again.running()] == ["j42"]


def test_product_labels_map_to_catalog_gpu_types():
    assert gpu_type_from_product("NVIDIA-H100-80GB-HBM3") == "H100"
    assert gpu_type_from_product("NVIDIA-A100-SXM4-80GB") == "A100"


SUCCEEDED_AT = datetime.fromisoformat("2025-05-02T10:02:29+00:00").timestamp()  # the fixtures'
FAILED_AT = datetime.fromisoformat("2025-05-02T10:01:39+00:00").timestamp()
RUN_BEGAN = SUCCEEDED_AT - 3600


def restarted(server: FakeApiServer, tmp_path: Path) -> KubernetesBackend:
    api = client.ApiClient(client.Configuration(host=server.url))
    return KubernetesBackend(client.CoreV1Api(api), NS, "img", tmp_path / "again")


def test_a_gang_that_succeeded_while_no_control_plane_watched_is_reported_finished(
    server, backend, tmp_path
):
    backend.start(GANG)
    for name in ("arbiter-j42-0", "arbiter-j42-1"):
        server.set_status(name, "pod-status-succeeded.json")
    again = restarted(server, tmp_path)
    assert again.running() == []
    ended = again.outcome("j42", RUN_BEGAN, RUN_BEGAN + 60)
    assert isinstance(ended, JobFinished) and ended.at == SUCCEEDED_AT  # the kubelet's end
    assert again.outcome("j42", SUCCEEDED_AT + 1) is None  # those pods are an earlier run's
    assert len(server.pods) == 2  # the only record of that end, until the server has it
    again.forget("j42")
    assert server.pods == {} and "loss 2.1" in again.log_path("j42").read_text()
    assert again.outcome("j42", RUN_BEGAN) is None


def test_a_gang_with_a_failed_pod_is_reported_failed_with_its_exit_code(server, backend, tmp_path):
    backend.start(GANG)
    server.set_status("arbiter-j42-0", "pod-status-succeeded.json")
    server.set_status("arbiter-j42-1", "pod-status-failed.json")
    ended = restarted(server, tmp_path).outcome("j42", RUN_BEGAN)
    assert isinstance(ended, JobFailed) and ended.exit_code == 3
    assert ended.at == SUCCEEDED_AT  # its GPUs were held until its last pod ended


def test_a_gang_with_a_pod_still_running_is_taken_back_whole(server, backend, tmp_path):
    backend.start(GANG)
    server.set_status("arbiter-j42-0", "pod-status-failed.json")
    server.set_status("arbiter-j42-1", "pod-status-running.json")
    again = restarted(server, tmp_path)
    assert [r.job_id for r in again.running()] == ["j42"]
    assert again.outcome("j42", RUN_BEGAN) is None
    failed = [e for e in again.poll() if isinstance(e, JobFailed)]
    assert [(e.job_id, e.exit_code) for e in failed] == [("j42", 3)]
    assert server.pods == {}


def test_a_job_queued_again_after_a_restart_starts_over_its_earlier_runs_pods(
    server, backend, tmp_path
):
    backend.start(GANG)
    server.set_status("arbiter-j42-0", "pod-status-failed.json")
    server.set_status("arbiter-j42-1", "pod-status-failed.json")
    again = restarted(server, tmp_path)
    again.start(GANG)  # the same pod names: the ended ones are deleted first
    assert [r.job_id for r in again.running()] == ["j42"]
    assert {p["status"]["phase"] for p in server.pods.values()} == {"Pending"}
