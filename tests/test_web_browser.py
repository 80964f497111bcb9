"""The web dashboard in a real headless Chromium (Debian's `chromium`, driven by playwright),
against a real supervisor and PostgreSQL: one supervisor and one browser for the module."""

from __future__ import annotations

import http.client
import shutil
import urllib.error
import urllib.request

import psycopg
import pytest
from playwright.sync_api import expect, sync_playwright

from fairsched.store.schema import TABLES
from tests.supervisor_harness import Supervisor, free_port

TOKEN = "browser-test-token-0123456789"
WAIT_MS = 15_000
expect.set_options(timeout=WAIT_MS)
MARKUP = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"

WORKERS = """
[[worker]]
name = "gated"
handler = "sup_handlers:gate"
types = ["gate"]

[[worker]]
name = "fixable"
handler = "sup_handlers:until_fixed"
types = ["fixable"]
"""


@pytest.fixture(scope="module")
def sup(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
    port = free_port()
    s = Supervisor(database_url, WORKERS,
                   supervisor=f'web = "127.0.0.1:{port}"\nweb_token = "{TOKEN}"\n')
    s.url = f"http://127.0.0.1:{port}"
    s.config.chmod(0o600)  # it holds the token
    try:
        s.start()
        s.wait_output(r"web dashboard on http://127\.0\.0\.1:\d+/")
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (make test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, sup):
    """A page of the dashboard; with the token given, as an operator enters it."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.on("dialog", lambda dialog: dialog.accept())  # the confirmation of each action
    try:
        yield pg
    finally:
        context.close()


def give_token(pg, token: str = TOKEN) -> None:
    pg.fill("#token", token)
    pg.click("#token-save")


def card(pg, job_id: int):
    return pg.locator(f"article.job[data-job-id='{job_id}']")


def test_the_slots_show_live_and_a_job_goes_from_pending_to_running_to_succeeded(page, sup):
    page.goto(sup.url + "/")
    expect(page.locator("#status")).to_have_text("live")
    expect(page.locator("#slots tr[data-worker='gated-1'] td.pid")).to_have_text(
        str(sup.slots("gated")[0]["pid"]))
    expect(page.locator("#slots tr[data-worker='fixable-1']")).to_have_attribute("data-state", "free")
    page.evaluate("window.__same_page = true")
    page.select_option("#job-status", "")  # all jobs
    first = sup.enqueue("gate", payload={"open": str(sup.dir / "open-1")})
    second = sup.enqueue("gate", payload={"open": str(sup.dir / "open-2")})  # waits for first
    expect(page.locator(f"#slots tr[data-job-id='{first}']")).to_have_attribute("data-state", "busy")
    expect(card(page, first)).to_have_attribute("data-status", "running")
    expect(card(page, second)).to_have_attribute("data-status", "pending")
    (sup.dir / "open-1").touch()
    expect(card(page, second)).to_have_attribute("data-status", "running")
    expect(page.locator(f"#slots tr[data-job-id='{second}']")).to_have_attribute("data-state", "busy")
    expect(card(page, first)).to_have_attribute("data-status", "succeeded")
    (sup.dir / "open-2").touch()
    expect(card(page, second)).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#queue tr[data-type='gate'] td").nth(1)).to_have_text("0")
    assert page.evaluate("window.__same_page") is True  # never reloaded


def test_a_failed_job_is_retried_through_its_button_and_markup_shows_as_text(page, sup):
    fixed = sup.dir / "fixed"
    job = sup.enqueue("fixable", payload={"fixed": str(fixed), "why": MARKUP, "note": MARKUP})
    page.goto(sup.url + "/")
    give_token(page)
    failed = card(page, job)
    expect(failed).to_have_attribute("data-status", "failed")
    expect(failed.locator("pre.error")).to_have_text(f"PermanentError: {MARKUP}")
    expect(failed.locator("pre.payload")).to_contain_text(MARKUP.replace('"', '\\"'))
    page.goto(f"{sup.url}/job/{job}")
    expect(page.locator("#detail")).to_have_attribute("data-status", "failed")
    expect(page.locator("#detail-fields pre.error")).to_have_text(f"PermanentError: {MARKUP}")
    assert page.evaluate("window.__pwned") is None
    fixed.touch()
    page.click("#detail-actions button[data-action='retry']")
    # The answer first: leaving the page at once could abort the request on its way.
    expect(page.locator("#notice")).to_have_text(f"Retry job {job}: done (pending)")
    page.goto(sup.url + "/")
    page.select_option("#job-status", "succeeded")
    expect(card(page, job)).to_have_attribute("data-status", "succeeded")
    assert page.evaluate("window.__pwned") is None
    assert f"web: job {job} retried (fixable)" in sup.output()


def test_a_running_job_is_cancelled_through_its_button(page, sup):
    job = sup.enqueue("gate", payload={"open": str(sup.dir / "never-opened")})
    page.goto(sup.url + "/")
    give_token(page)
    page.select_option("#job-status", "running")
    card(page, job).locator("button[data-action='cancel']").click()
    expect(page.locator("#notice")).to_have_text(f"Cancel job {job}: done (running)")
    page.select_option("#job-status", "cancelled")
    expect(card(page, job)).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#slots tr[data-worker='gated-1']")).to_have_attribute("data-state", "free")


def test_a_group_is_restarted_through_its_button(page, sup):
    before = sup.slots("fixable")[0]["pid"]
    page.goto(sup.url + "/")
    give_token(page)
    page.click("#groups button[data-group='fixable']")
    ps = sup.wait_for(lambda ps: any(s["worker"] == "fixable-1" and s["state"] == "free"
                                     and s["pid"] not in (None, before) for s in ps["slots"]),
                      what="fixable-1 replaced")
    (after,) = [s["pid"] for s in ps["slots"] if s["worker"] == "fixable-1"]
    expect(page.locator("#slots tr[data-worker='fixable-1'] td.pid")).to_have_text(str(after))
    sup.wait_output(r"worker fixable-1 restarted by the operator")


def test_without_the_token_an_action_is_refused_and_the_page_says_so(page, sup):
    job = sup.enqueue("fixable", payload={"fixed": str(sup.dir / "never"), "why": "no"})
    page.goto(sup.url + "/")
    expect(card(page, job)).to_have_attribute("data-status", "failed")  # reads need none here
    expect(page.locator("#refused")).to_be_hidden()
    card(page, job).locator("button[data-action='retry']").click()
    expect(page.locator("#refused")).to_be_visible()
    expect(page.locator("#notice")).to_contain_text("the dashboard's token is needed")
    give_token(page, "a-wrong-token-of-some-length")
    card(page, job).locator("button[data-action='retry']").click()
    expect(page.locator("#refused")).to_be_visible()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{sup.url}/api/jobs/{job}/retry",
                                                      method="POST"), timeout=10)
    refused.value.close()
    assert refused.value.code == 401
    with psycopg.connect(sup.env["FAIRSCHED_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT status, attempts FROM fairsched_jobs WHERE id = %s",
                            (job,)).fetchone() == ("failed", 1)


def test_on_loopback_only_requests_addressed_to_it_are_answered(sup):
    """A site whose name resolves to 127.0.0.1 cannot read the dashboard from a browser."""
    port = int(sup.url.rsplit(":", 1)[1])
    for host, status in ((f"rebound.example:{port}", 403), (f"localhost:{port}", 200),
                         (f"127.0.0.1:{port}", 200)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/api/ps", headers={"Host": host})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == status, host
        finally:
            conn.close()
