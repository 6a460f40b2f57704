"""The dashboard in a real headless browser (Debian's chromium driven by Playwright) against the
seeded live service. Screenshots go to test-artifacts/ at the repository root."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpu_arbiter.web.views import Viewer, heatmap_view
from tests.control.harness import ADMIN
from tests.web.clusters import big_cluster

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="browser tests need playwright (pip install playwright)"
)
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"browser tests need {CHROMIUM} (apt install chromium)"
)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def load(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-loaded='1']", timeout=30_000)


def test_dashboard_shows_the_seeded_heatmap_queue_and_team_costs(seeded, page):
    page.add_init_script(f"localStorage.setItem('arbiterToken', {json.dumps(ADMIN)})")
    load(page, seeded.url + "/")
    canvas = page.locator("#heatmap")
    assert canvas.get_attribute("data-gpus") == "40"
    assert canvas.get_attribute("data-racks") == "2"
    counts = json.loads(canvas.get_attribute("data-counts"))
    assert counts["tier 1"] == 8 and counts["borrowed"] == 10 and counts["free"] == 6
    assert counts["failed"] == 8 and counts["cordoned"] == 8
    # The legend counts tiers with their borrowed GPUs: research's two tier-3 jobs borrow 10.
    assert page.locator("#legend [data-cell='3'] b").inner_text() == "10"
    assert page.locator("#legend [data-cell='b'] b").inner_text() == "10"
    running = page.locator("#running tbody tr")
    assert running.count() == 3
    pretrain = page.locator(f"#running tr[data-job='{seeded.running['pretrain']}']")
    assert pretrain.get_attribute("data-team") == "vision"
    assert pretrain.locator("td[data-field='cost']").inner_text().endswith(" / h")
    rows = page.locator("#queue tbody tr")
    assert rows.count() == 3
    seen = {
        rows.nth(i).get_attribute("data-job"): (
            rows.nth(i).get_attribute("data-team"),
            rows.nth(i).get_attribute("data-tier"),
            rows.nth(i).get_attribute("data-reason"),
        )
        for i in range(3)
    }
    p = seeded.pending
    assert seen == {
        p["sweep"]: ("research", "3", "gang"),
        p["big-eval"]: ("vision", "3", "capacity"),
        p["try-out"]: ("interns", "3", "budget"),
    }
    assert "asked 2" in page.locator(f"#queue tr[data-job='{p['try-out']}']").inner_text()
    for team, burn in seeded.burn.items():
        cell = page.locator(f"#teams tr[data-team='{team}'] td[data-field='burn']")
        assert cell.inner_text().startswith(f"{burn:.2f}")
    spent = page.locator("#teams tr[data-team='vision'] td[data-field='spent']").inner_text()
    assert "/ 1,000 credits" in spent
    page.wait_for_function("document.getElementById('timeline').dataset.events >= 2")
    page.locator("#heatmap").hover(position={"x": 5, "y": 20})
    assert "node gpu-node-1 (rack0, 8 × H100" in page.locator("#tip").inner_text()
    box = page.evaluate(
        "() => { const p = heat.panels.find(p => p.rack.name === 'rack1');"
        " return {x: p.x + 2 + p.cell / 2, y: p.y + 16 + p.step + p.cell / 2}; }"
    )  # the first GPU of the rack's second node
    page.locator("#heatmap").hover(position=box)
    assert page.locator("#tip").inner_text().startswith("node n3 (rack1")
    shot(page, "dashboard-admin.png")


def test_team_lead_sees_its_own_jobs_and_spend_only(seeded, page):
    load(page, f"{seeded.url}/#token={seeded.tokens['research']}")
    assert page.url.endswith("/")  # the token left the address bar
    teams = page.locator("#teams tbody tr")
    assert teams.count() == 1 and teams.first.get_attribute("data-team") == "research"
    assert page.locator("#queue tbody tr").count() == 1
    assert "2 of other teams" in page.locator("#queue-summary").inner_text()
    running = page.locator("#running tbody tr")
    assert running.count() == 2
    assert {running.nth(i).get_attribute("data-team") for i in range(2)} == {"research"}
    page.wait_for_function("document.getElementById('timeline').dataset.events !== undefined")
    own = {j["id"] for j in seeded.admin.get("/v1/jobs", params={"team": "research"}).json()}
    subjects = page.eval_on_selector_all(
        "#events li[data-subject]", "els => els.map(e => e.dataset.subject)"
    )
    assert set(subjects) <= own  # no node events, no other team's jobs
    assert "team research" in page.locator("#who").inner_text()
    shot(page, "dashboard-team-research.png")


def test_dashboard_asks_for_a_token_it_does_not_have(seeded, page):
    page.goto(seeded.url + "/")
    page.wait_for_selector("#login:not([hidden])")
    text = page.locator("#login").inner_text()
    assert "arbiter-state/admin.token" in text and "arbiter tokens create --team" in text
    assert not page.locator("#heatmap").is_visible()  # the sign-in form stands alone
    shot(page, "login.png")
    page.fill("#token", ADMIN)
    page.click("#login button")
    page.wait_for_selector("body[data-loaded='1']")
    assert page.locator("#heatmap").get_attribute("data-gpus") == "40"


def test_job_page_draws_the_telemetry_and_lists_checkpoints_events_and_cost(seeded, page):
    job = seeded.running["pretrain"]
    for step, loss in ((100, 2.9), (200, 2.6), (300, 2.4)):
        body = {"step": step, "loss": loss, "tokens_per_s": 900.0 + step, "io_wait_share": 0.1}
        assert seeded.admin.post(f"/v1/jobs/{job}/telemetry", json=body).status_code == 200
    body = {"event": "checkpoint", "checkpoint_step": 300}
    assert seeded.admin.post(f"/v1/jobs/{job}/telemetry", json=body).status_code == 200
    page.add_init_script(f"localStorage.setItem('arbiterToken', {json.dumps(ADMIN)})")
    load(page, seeded.url + "/")
    page.click(f"#running tr[data-job='{job}'] a")
    page.wait_for_selector("body[data-loaded='1']")
    assert page.url.endswith(f"/jobs/{job}")
    for chart in ("loss", "tokens_per_s", "io_wait_share"):
        assert int(page.locator(f"#chart-{chart}").get_attribute("data-points")) >= 3
    assert "300" in page.locator("#checkpoints tbody").inner_text()
    assert page.locator("#events tr[data-kind='started']").count() == 1
    assert page.locator("#cost tr[data-kind='accruing']").count() == 1
    assert "pretrain" in page.locator("#j-name").inner_text()
    shot(page, "job-page.png")


def test_heatmap_of_ten_thousand_gpus_draws_without_lag(seeded, page):
    payload = json.dumps(heatmap_view(big_cluster(), Viewer("admin", None)))
    page.route(
        "**/ui/api/heatmap",
        lambda route: route.fulfill(status=200, content_type="application/json", body=payload),
    )
    page.add_init_script(f"localStorage.setItem('arbiterToken', {json.dumps(ADMIN)})")
    load(page, seeded.url + "/")
    canvas = page.locator("#heatmap")
    assert canvas.get_attribute("data-gpus") == "10240"
    assert float(canvas.get_attribute("data-draw-ms")) < 250
    redraw_ms = page.evaluate(
        "() => { const t = performance.now();"
        " for (let i = 0; i < 10; i++) arbiter.redraw();"
        " return (performance.now() - t) / 10; }"
    )
    assert redraw_ms < 100
    shot(page, "heatmap-10k.png")


def test_reports_page_shows_the_bench_kpis_and_plots(seeded, page):
    page.goto(seeded.url + "/reports")
    page.click("#reports a")
    page.wait_for_selector("#kpis")
    head = page.locator("#kpis thead").inner_text()
    assert "fifo" in head and "arbiter" in head
    assert "mean JCT" in page.locator("#kpis tbody").inner_text()
    assert page.locator("#across-seeds").count() == 1  # bench --seeds 2: the spread
    assert page.locator("table.seed").count() == 2  # and every seed's own table
    images = page.locator(".plots img")
    assert images.count() == 3
    page.wait_for_function(
        "[...document.querySelectorAll('.plots img')].every(i => i.complete && i.naturalWidth)"
    )
    shot(page, "report.png")


@pytest.mark.parametrize(
    ("path", "rendered"),
    [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id^='tag/jobs/operation']")],
)
def test_api_docs_render_with_nothing_but_localhost_reachable(seeded, page, path, rendered):
    """Every request the page makes to anywhere but the service is refused, as on a cluster
    without internet access; the operations must still render."""
    outside: list[str] = []
    local = seeded.url.split("://", 1)[1].split("/", 1)[0]

    def only_local(route):
        host = route.request.url.split("://", 1)[-1].split("/", 1)[0]
        if host == local or route.request.url.startswith(("data:", "blob:")):
            return route.continue_()
        outside.append(f"{route.request.resource_type} {route.request.url}")
        return route.abort("internetdisconnected")

    page.route("**/*", only_local)
    page.goto(seeded.url + path)
    page.wait_for_selector(rendered, timeout=30_000)
    text = page.locator("body").inner_text()
    assert "/v1/jobs" in text and "/v1/teams/{name}" in text
    # ReDoc's bundle links its "powered by" logo from its CDN; the image is all that is lost.
    assert [u for u in outside if not u.startswith("image https://cdn.redoc.ly/")] == []
    shot(page, f"api{path.replace('/', '-')}.png")
