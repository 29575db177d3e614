"""The web dashboard (`shoal ui`, docs/ui.md) driven in Debian's chromium by Playwright: the jobs
list with its filters, a job followed live and killed from the page, the timeline after a
restart, resource charts, task output shown as text only, the token and the cross-site guard
off loopback. Each page is saved as a screenshot under $SHOAL_SCREENSHOT_DIR (build/ui-screenshots
under ctest), which CI keeps.

Runs with the browser venv's python (/var/cache/shoal/venvs/browser, made by ./setup.sh from
tests/ui/requirements.txt); the browser is /usr/bin/chromium, never a download.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

import framework_examples as fx
import shoal_e2e as e2e

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("SHOAL_SCREENSHOT_DIR")
                   or e2e.REPO_ROOT / "build" / "ui-screenshots")
URL = re.compile(r"shoal ui: (http://\S+/)")
# Long enough for any page to show what the server has (the page refreshes every 2-3 s).
UI_TIMEOUT_MS = 20000


@pytest.fixture(scope="module")
def browser():
    assert os.access(CHROMIUM, os.X_OK), f"no {CHROMIUM}: ./setup.sh installs Debian's chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page of its own context (no cookies from another test). A script error in the
    page fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(UI_TIMEOUT_MS)
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # What the Content-Security-Policy refused (an inline style or script) is an error too.
    pg.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text
          and errors.append(m.text))
    yield pg
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def screenshot(pg, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def start_ui(start_shoal, *args):
    """Starts `shoal ui` on a free port; returns (client, base URL)."""
    client = start_shoal("ui", "--listen", "127.0.0.1:0", *args)
    url = e2e.wait_until(lambda: (m := URL.search(client.stdout())) and m.group(1)
                         or (client.poll() is not None and pytest.fail(
                             f"shoal ui exited {client.poll()}: {client.stderr()}")),
                         30, "shoal ui to print its address")
    return client, url


@pytest.fixture
def ui(start_shoal, jobs_dir):
    jobs_dir.mkdir(parents=True, exist_ok=True)
    _, url = start_ui(start_shoal)
    return url


def task_status(shoal_status, job_id, task="worker:0"):
    status = shoal_status(job_id)
    return next((t for t in status.get("tasks", []) if t["task"] == task), None), status


def http(method, url, headers=None, data=None):
    """(status, parsed JSON body or text) of a plain request, outside the browser."""
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


# ---------------------------------------------------------------------------------------------

def test_jobs_list_filters_sorts_pages_and_keeps_them_in_the_url(ui, page, write_job, detach_job,
                                                                 wait_for_state):
    ids = {}
    for name, code in (("alpha", 0), ("bravo", 3), ("charlie", 0)):
        job = write_job(f"""
            name: {name}
            roles:
              worker:
                command: ["/bin/sh", "-c", "echo {name}; exit {code}"]
                resources: {{cpus: 0.25}}
            """, name=f"{name}.yaml")
        ids[name] = detach_job(job)
    for name, job_id in ids.items():
        wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 60,
                       f"{name} to end")

    page.goto(ui)
    rows = page.locator("tbody tr[data-job]")
    expect(rows).to_have_count(3)
    # Newest first by default.
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.job)") == [
        ids["charlie"], ids["bravo"], ids["alpha"]]
    expect(page.locator("button.filter[data-state=failed] .count")).to_have_text("1")
    expect(page.locator("button.filter[data-state=succeeded] .count")).to_have_text("2")
    screenshot(page, "jobs")

    # A state filter: one row, and the URL says so (a reload keeps it).
    page.click("button.filter[data-state=failed]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", ids["bravo"])
    assert "state=failed" in page.url
    page.reload()
    expect(rows).to_have_count(1)
    expect(page.locator("button.filter[data-state=failed]")).to_have_attribute("aria-pressed", "true")
    page.click("button.filter[data-state='']")
    expect(rows).to_have_count(3)

    # The text filter (debounced) and its URL.
    page.fill("input.search", "charl")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", ids["charlie"])
    assert "q=charl" in page.url
    page.fill("input.search", "")
    expect(rows).to_have_count(3)

    # Sorting by name: ascending, then descending.
    page.click("th[data-sort=name] button")
    expect(rows.first).to_have_attribute("data-job", ids["alpha"])
    assert "sort=name" in page.url
    page.click("th[data-sort=name] button")
    expect(rows.first).to_have_attribute("data-job", ids["charlie"])
    assert "sort=-name" in page.url

    # Pages of one job each, from the URL; the pager moves through them.
    page.goto(ui + "?sort=name&per_page=1")
    expect(rows).to_have_count(1)
    expect(page.locator(".page-of")).to_have_text("page 1 of 3")
    expect(rows.first).to_have_attribute("data-job", ids["alpha"])
    page.click("button.page-next")
    expect(page.locator(".page-of")).to_have_text("page 2 of 3")
    expect(rows.first).to_have_attribute("data-job", ids["bravo"])
    assert "page=2" in page.url

    # The list refreshes itself: a new job shows up without a reload.
    page.goto(ui)
    expect(rows).to_have_count(3)
    delta = detach_job(write_job("""
        name: delta
        roles:
          worker:
            command: ["/bin/true"]
            resources: {cpus: 0.25}
        """, name="delta.yaml"))
    expect(rows).to_have_count(4)
    expect(rows.first).to_have_attribute("data-job", delta)

    # Run again from a job's page: the same file, a new job, and the page moves to it.
    page.click(f"tr[data-job='{ids['alpha']}'] td a >> nth=0")
    page.wait_for_url(f"**/jobs/{ids['alpha']}")
    page.click("button.rerun")
    page.wait_for_url(re.compile(r"/jobs/alpha-(?!" + re.escape(ids["alpha"][6:]) + r")[^/]+$"))
    again = page.url.rsplit("/", 1)[1]
    assert again != ids["alpha"] and again.startswith("alpha-"), again
    expect(page.locator(".job-title")).to_have_text("alpha")
    wait_for_state(again, lambda s: s["state"] == "succeeded", 60, "the second alpha to end")
    expect(page.locator(".job-state .state")).to_have_text("succeeded")


def test_log_pages_go_back_to_older_lines_and_filter_by_task(ui, page, write_job, run_shoal,
                                                             jobs_dir):
    job = write_job("""
        name: chatty
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "for i in $(seq 1 300); do echo line $i of $SHOAL_INDEX; done"]
            resources: {cpus: 0.25}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    page.goto(f"{ui}jobs/{job_dir.name}")
    lines = page.locator("#logs .log-line")
    expect(lines).to_have_count(200)
    expect(page.locator(".log-follow")).not_to_be_checked()  # the job is over
    page.click("button.log-older")
    expect(lines).to_have_count(400)
    page.click("button.log-older")
    expect(lines).to_have_count(600)
    expect(page.locator("button.log-older")).to_be_disabled()
    expect(page.locator(".log-status")).to_have_text("600 lines")
    # In file order, without a line twice.
    offsets = lines.evaluate_all("ls => ls.map(l => Number(l.dataset.offset))")
    assert offsets == sorted(set(offsets)), "the pages overlap or are out of order"

    # One task: its lines only, the older ones on request.
    page.select_option("select.log-task", "worker:1")
    expect(lines).to_have_count(200)
    texts = page.locator("#logs .log-text").all_text_contents()
    assert texts == [f"line {i} of 1" for i in range(101, 301)], texts[:3]
    page.click("button.log-older")
    expect(lines).to_have_count(300)
    expect(page.locator("#logs .log-text").first).to_have_text("line 1 of 1")
    expect(page.locator("button.log-older")).to_be_disabled()


def test_list_to_job_follows_logs_while_it_prints_and_kills_it(ui, page, write_job, detach_job,
                                                              wait_for_state, shoal_status):
    job = write_job("""
        name: ticker
        roles:
          worker:
            command: ["/usr/bin/python3", "-u", "-c",
                      "import time\\nfor i in range(150):\\n    print('tick', i, flush=True)\\n    time.sleep(0.2)"]
            resources: {cpus: 0.25}
        """)
    job_id = detach_job(job)
    wait_for_state(job_id, lambda s: s["state"] == "running", 60, "the job to run")

    page.goto(ui)
    page.click(f"tr[data-job='{job_id}'] td a >> nth=0")
    page.wait_for_url(f"**/jobs/{job_id}")
    expect(page.locator(".job-state .state")).to_have_text("running")
    expect(page.locator(".log-follow")).to_be_checked()

    def last_tick():
        texts = page.locator("#logs .log-text").all_text_contents()
        ticks = [int(t.split()[1]) for t in texts if t.startswith("tick ")]
        return max(ticks) if ticks else -1

    # Lines arrive in the page while the task prints them: the panel does not reload itself,
    # so these come through the follow stream.
    e2e.wait_until(lambda: last_tick() >= 0, 20, "the first tick in the log panel", interval=0.2)
    first = last_tick()
    e2e.wait_until(lambda: last_tick() >= first + 10, 20,
                   f"ten more ticks to stream in after tick {first}", interval=0.2)
    status = shoal_status(job_id)
    assert status["state"] == "running", status
    expect(page.locator("#timeline rect.gen[data-task='worker:0']")).to_have_count(1)
    screenshot(page, "job-running")

    # Kill from the page (the button asks once more).
    page.click("button.kill")
    expect(page.locator("button.kill")).to_have_text("Really kill?")
    page.click("button.kill")
    expect(page.locator(".job-state .state")).to_have_text("killed", timeout=30000)
    expect(page.locator("tr[data-task='worker:0'] .state")).to_have_text("killed")
    expect(page.locator("button.kill")).to_be_disabled()
    assert shoal_status(job_id)["state"] == "killed"
    expect(page.locator(".log-status")).to_have_text("the job is over: every line is shown")
    assert last_tick() < 149, "the job ran to its end: the kill did nothing"

    # And the list says so too.
    page.click("header nav a[href='/']")
    expect(page.locator(f"tr[data-job='{job_id}'] .state")).to_have_text("killed")


def test_timeline_shows_a_restart_after_a_task_is_killed(ui, page, write_job, detach_job,
                                                         wait_for_state, run_shoal, jobs_dir):
    job = write_job("""
        name: restarter
        on_failure: restart-task
        max_restarts: 2
        backoff: {initial: 200ms, max: 200ms}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "-u", "-c",
                      "import os, time\\nprint('attempt', os.environ['SHOAL_RESTART_COUNT'])\\ntime.sleep(120)"]
            resources: {cpus: 0.25}
        """)
    job_id = detach_job(job)
    status = wait_for_state(job_id, lambda s: s["state"] == "running" and all(
        t["state"] == "running" and t.get("pid") for t in s["tasks"]), 60, "both tasks to run")
    victim = next(t for t in status["tasks"] if t["task"] == "worker:1")
    # Once it has printed, so that both attempts have a line in the log.
    logs = jobs_dir / job_id / "logs.txt"
    e2e.wait_until(lambda: logs.exists() and "worker:1 | attempt 0" in logs.read_text(), 30,
                   "worker:1 to print its first line")
    assert e2e.kill_task(victim["pid"], job_id), f"worker:1 (pid {victim['pid']}) is gone"
    wait_for_state(job_id, lambda s: any(t["task"] == "worker:1" and t["restarts"] == 1 and
                                         t["state"] == "running" for t in s["tasks"]),
                   60, "worker:1 to run again")

    page.goto(f"{ui}jobs/{job_id}")
    gens = page.locator("#timeline rect.gen[data-task='worker:1']")
    expect(gens).to_have_count(2)
    assert gens.evaluate_all("rs => rs.map(r => [r.dataset.attempt, r.dataset.state])") == [
        ["0", "failed"], ["1", "running"]]
    expect(page.locator("#timeline rect.gen[data-task='worker:0']")).to_have_count(1)
    expect(page.locator("#timeline .event-marker[data-kind=restart][data-task='worker:1']")).to_have_count(1)
    expect(page.locator("#timeline .event-marker[data-kind=failure][data-task='worker:1']")).to_have_count(1)
    # The failure's cause is on the page (the events list), as text.
    page.click("#timeline details.events summary")
    expect(page.locator("#timeline tr.event-failure")).to_contain_text("signal")
    expect(page.locator("tr[data-task='worker:1'] td").nth(5)).to_have_text("1")
    # The logs of worker:1 alone: both attempts.
    page.select_option("select.log-task", "worker:1")
    expect(page.locator("#logs .log-text")).to_have_text(["attempt 0", "attempt 1"])
    screenshot(page, "job-restart")

    r = run_shoal("kill", job_id, timeout=60)
    assert r.returncode == 0, r.stderr


def write_samples(job_dir, task_dir, samples):
    path = Path(job_dir) / "tasks" / task_dir / "resources.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_resource_charts_are_drawn_from_the_samples(ui, page, write_job, run_shoal, jobs_dir):
    """The charts from samples in the job directory's documented format (docs/design/0014):
    CPU and memory per task with the job's total, GPU charts when samples have GPUs, and steps/s
    in the tasks table from the last two samples."""
    job = write_job("""
        name: sampled
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo step $i; sleep 0.2; done"]
            resources: {cpus: 0.25}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    status = json.loads((job_dir / "status.json").read_text())
    t0, t1 = status["created_unix_ms"], status["finished_unix_ms"]
    for index in (0, 1):
        write_samples(job_dir, f"worker-{index}", [
            {"ts_ms": t0 + i * (t1 - t0) // 10, "cpu_percent": 40 + 10 * index + 3 * i,
             "rss_bytes": (200 + 100 * index + 20 * i) << 20, "step": 2 * i, "attempt": 0,
             "gpus": [{"index": 0, "util_percent": 50 + 10 * index + 4 * i,
                       "memory_bytes": (1 << 30) + (index + i) * (1 << 26)}]}
            for i in range(11)])

    page.goto(f"{ui}jobs/{job_dir.name}")
    for chart in ("cpu", "memory", "gpu-util", "gpu-memory"):
        expect(page.locator(f"#charts [data-chart={chart}] canvas")).to_have_count(1)
        expect(page.locator(f"#charts [data-chart={chart}]")).to_have_attribute("data-points", "11")
    expect(page.locator("#charts .no-samples")).to_be_hidden()
    # The first series (worker:0, the palette's blue #1f77b4) is drawn: its pixels are on the
    # CPU chart's canvas.
    blue = page.locator("#charts [data-chart=cpu] canvas").evaluate("""c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
          if (Math.abs(d[i] - 0x1f) < 40 && Math.abs(d[i + 1] - 0x77) < 40 && Math.abs(d[i + 2] - 0xb4) < 40 && d[i + 3] > 128) n++;
        return n; }""")
    assert blue > 50, f"the CPU chart shows no line of worker:0 ({blue} blue pixels)"
    # The legend names each task and the job total.
    legend = page.locator("#charts [data-chart=cpu] .u-legend").inner_text()
    assert "worker:0" in legend and "worker:1" in legend and "job total" in legend, legend
    # Steps per second from the last two samples (2 steps apart).
    rate = 2 / (((t1 - t0) - 9 * (t1 - t0) // 10) / 1000)
    expect(page.locator("tr[data-task='worker:0'] td").nth(7)).to_have_text(f"{rate:.2f}")
    screenshot(page, "job-charts")


def test_resource_charts_of_a_running_job(ui, page, write_job, detach_job, wait_for_state,
                                          run_shoal):
    """The agents' own samples (every 2 s, tasks/<role>-<index>/resources.jsonl) drawn while
    the job runs: a task holding 64 MB shows on the memory chart, and the charts grow."""
    job = write_job("""
        name: busy
        roles:
          worker:
            command: ["/usr/bin/python3", "-c", "import time\\nheld = bytearray(64 << 20)\\ntime.sleep(60)"]
            resources: {cpus: 0.25}
        """)
    job_id = detach_job(job)
    wait_for_state(job_id, lambda s: s["state"] == "running", 60, "the job to run")
    page.goto(f"{ui}jobs/{job_id}")
    try:
        cpu = page.locator("#charts [data-chart=cpu]")
        memory = page.locator("#charts [data-chart=memory]")
        expect(cpu.locator("canvas")).to_have_count(1, timeout=15000)
        expect(memory.locator("canvas")).to_have_count(1)
        points = lambda chart: int(chart.get_attribute("data-points") or 0)
        first = points(memory)
        e2e.wait_until(lambda: points(memory) >= max(first + 1, 2), 15,
                       "a new sample on the memory chart (the page refreshes itself)", interval=0.2)
        # Pointing at the chart, its legend gives the task's memory: the 64 MB it holds, and more.
        box = memory.locator(".u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
        value = memory.locator(".u-legend .u-series").nth(1).locator(".u-value")
        expect(value).to_have_text(re.compile(r"^\d+ MiB$"))
        assert int(value.inner_text().split()[0]) >= 64, value.inner_text()
        screenshot(page, "job-running-charts")
    finally:
        run_shoal("kill", job_id, timeout=60)


def test_an_unknown_job_or_page_says_so(ui, page):
    page.goto(f"{ui}jobs/no-such-job")
    expect(page.locator("#banner")).to_contain_text("no job 'no-such-job'")
    page.goto(f"{ui}no/such/page")
    # The server answers 404 for a path that is none of the app's pages.
    expect(page.locator("body")).to_contain_text("no page /no/such/page")
    page.goto(ui)
    expect(page.locator("td.empty")).to_contain_text("No jobs yet")
    page.click("header nav a[href='/models']")
    assert page.url == f"{ui}models"
    expect(page.locator(".models")).to_contain_text("--serve")
    page.go_back()
    expect(page.locator("td.empty")).to_contain_text("No jobs yet")


def test_task_output_is_shown_as_text_and_runs_nothing(ui, page, write_job, detach_job,
                                                       wait_for_state):
    hostile = ["<img src=x onerror=alert(1)>", "<script>alert(2)</script>",
               "<b>not bold</b> & &amp; \"quoted\""]
    printed = "; ".join(f"echo '{h}'" for h in hostile)
    # Printed once before the page opens and once after (through the follow stream).
    job = write_job(f"""
        name: hostile
        roles:
          worker:
            command: ["/bin/sh", "-c", "{printed.replace('"', chr(92) + '"')}; sleep 4; {printed.replace('"', chr(92) + '"')}"]
            resources: {{cpus: 0.25}}
        """)
    job_file_text = job.read_text()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    job_id = detach_job(job)
    wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES or (
        s["state"] == "running"), 60, "the job to start")
    page.goto(f"{ui}jobs/{job_id}")
    lines = page.locator("#logs .log-text")
    e2e.wait_until(lambda: lines.all_text_contents().count(hostile[0]) == 2, 30,
                   "both printings of the <img> line in the log panel, literally", interval=0.2)
    texts = lines.all_text_contents()
    for h in hostile:
        assert texts.count(h) == 2, (h, texts)
    # Nothing became markup: no image, script or bold element in the logs or the job file.
    for where in ("#logs", "#spec", "#timeline"):
        assert page.locator(f"{where} img").count() == 0, where
        assert page.locator(f"{where} script").count() == 0, where
        assert page.locator(f"{where} b").count() == 0, where
    assert page.locator("img[src=x]").count() == 0
    # The job file is shown as submitted, as text.
    expect(page.locator("#spec")).to_have_text(job_file_text)
    wait_for_state(job_id, lambda s: s["state"] == "succeeded", 60, "the job to end")
    page.wait_for_timeout(500)  # an image's onerror would have fired by now
    assert dialogs == [], f"a dialog opened: {dialogs}"

    # An action the server refuses shows its reason in the banner: the job file changed since.
    job.write_text(job_file_text + "# edited\n")
    page.click("button.rerun")
    expect(page.locator("#banner")).to_be_visible()
    expect(page.locator("#banner")).to_contain_text("changed since this job ran")
    screenshot(page, "job-hostile-output")


def test_off_loopback_needs_a_token_and_state_changes_need_the_header(start_shoal, run_shoal,
                                                                      browser, jobs_dir, tmp_path):
    jobs_dir.mkdir(parents=True, exist_ok=True)
    r = run_shoal("ui", "--listen", "0.0.0.0:0", timeout=30)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stdout}{r.stderr}"
    assert "--token-file" in r.stderr, r.stderr

    token = "f00dfeed" * 4
    token_file = tmp_path / "ui-token"
    token_file.write_text(token + "\n")
    client = start_shoal("ui", "--listen", "0.0.0.0:0", "--token-file", token_file)
    url = e2e.wait_until(lambda: (m := URL.search(client.stdout())) and m.group(1), 30,
                         "shoal ui to print its address")
    port = int(re.search(r":(\d+)/$", url).group(1))
    base = f"http://127.0.0.1:{port}"

    # Without the token: the API answers 401, the page sends the browser to /login.
    status, body = http("GET", base + "/api/jobs")
    assert status == 401, (status, body)
    status, body = http("GET", base + "/api/jobs", headers={"Authorization": f"Bearer {token}"})
    assert status == 200 and body["jobs"] == [], (status, body)

    context = browser.new_context(viewport={"width": 1000, "height": 600})
    try:
        pg = context.new_page()
        pg.set_default_timeout(UI_TIMEOUT_MS)
        pg.goto(base + "/")
        pg.wait_for_url("**/login")
        screenshot(pg, "login")
        pg.fill("input[name=token]", "wrong" * 4)
        pg.click("button[type=submit]")
        expect(pg.locator("p.error")).to_have_text("Wrong token.")
        assert pg.locator("table.jobs-table").count() == 0
        pg.fill("input[name=token]", token)
        pg.click("button[type=submit]")
        pg.wait_for_url(base + "/")
        expect(pg.locator("table.jobs-table")).to_be_visible()
        expect(pg.locator("td.empty")).to_contain_text("No jobs yet")

        # Signed in, a POST still needs X-Shoal-Request: without it 403, with it the request
        # reaches the API (404: there is no such job).
        no_header = pg.request.post(base + "/api/jobs/nojob/kill")
        assert no_header.status == 403, (no_header.status, no_header.text())
        assert "X-Shoal-Request" in no_header.json()["error"]
        with_header = pg.request.post(base + "/api/jobs/nojob/kill",
                                      headers={"X-Shoal-Request": "1"})
        assert with_header.status == 404, (with_header.status, with_header.text())
        # From another site's page (its Origin), even with the header: 403.
        cross = pg.request.post(base + "/api/jobs/nojob/kill",
                                headers={"X-Shoal-Request": "1", "Origin": "http://evil.example"})
        assert cross.status == 403, (cross.status, cross.text())
    finally:
        context.close()


def test_models_page_shows_each_servers_models_and_their_statistics(start_shoal, page, jobs_dir,
                                                                    tmp_path):
    """A real `shoal serve` with the example models, some requests to the MLP, and one server
    that does not answer: the page shows readiness, versions, latency and errors of each."""
    jobs_dir.mkdir(parents=True, exist_ok=True)
    _, url = start_ui(start_shoal)
    page.goto(url + "models")
    expect(page.locator(".models")).to_contain_text("--serve")

    repository = tmp_path / "models"
    r = subprocess.run([e2e.PYTHON, str(e2e.REPO_ROOT / "examples" / "serving" / "export_models.py"),
                        "--out", str(repository)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    serve = start_shoal("serve", "--model-repository", repository, "--http-port", "0",
                        "--grpc-port", "0")
    serve_url = e2e.wait_until(
        lambda: (m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", serve.stdout()))
        and m.group(1), 60, "shoal serve to print its port")
    e2e.wait_until(lambda: http("GET", serve_url + "/v2/health/ready")[0] == 200, 120,
                   "the models to load")

    def infer(n):
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                       "data": [0.5] * 16}]}).encode()
        for _ in range(n):
            status, reply = http("POST", serve_url + "/v2/models/mlp/infer",
                                 headers={"Content-Type": "application/json"}, data=body)
            assert status == 200, reply
    infer(20)

    _, url = start_ui(start_shoal, "--serve", serve_url, "--serve", "http://127.0.0.1:9")
    page.goto(url + "models")
    server = page.locator(f"section.server[data-server='{serve_url}']")
    expect(server.locator("h2 .state")).to_have_text("ready")
    mlp = server.locator("tr[data-model=mlp]")
    expect(mlp.locator(".version")).to_have_count(2)
    expect(server.locator("tr[data-model=identity]")).to_have_count(1)
    cells = mlp.locator("td")
    expect(cells.nth(3)).not_to_be_empty()  # p50
    expect(cells.nth(7)).to_have_text("0")  # errors
    # Requests per second from two scrapes (the page refreshes itself) with requests between.
    infer(20)
    expect(cells.nth(2)).not_to_have_text("—", timeout=15000)
    unreachable = page.locator("section.server[data-server='http://127.0.0.1:9']")
    expect(unreachable.locator("h2 .state")).to_have_text("not-ready")
    expect(unreachable.locator(".server-error")).not_to_be_empty()
    screenshot(page, "models")


def test_tensorboard_button_links_to_a_tensorboard_that_stops_with_the_ui(start_shoal, page,
                                                                         write_job, run_shoal,
                                                                         jobs_dir):
    fx.require_venv("tensorboard")
    jobs_dir.mkdir(parents=True, exist_ok=True)
    client, url = start_ui(start_shoal)
    job = write_job("""
        name: boarded
        tensorboard: {}
        roles:
          worker:
            command: ["/bin/sh", "-c", "mkdir -p $SHOAL_TENSORBOARD_LOGDIR/run"]
            resources: {cpus: 0.25}
        """)
    r = run_shoal("run", job, timeout=120)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    page.goto(f"{url}jobs/{job_dir.name}")
    page.click("button.tensorboard")
    link = page.locator("a.tensorboard-link")
    expect(link).to_have_attribute("href", re.compile(r"^http://127\.0\.0\.1:\d+/$"), timeout=60000)
    board = link.get_attribute("href")
    assert http("GET", board)[0] == 200
    # Stopping the dashboard stops the TensorBoard it started.
    client.proc.send_signal(signal.SIGTERM)
    try:
        rc = client.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("shoal ui did not stop within 30 s of SIGTERM (waiting for its TensorBoard?)")
    assert rc == 0, client.stderr()

    def refused():
        try:
            urllib.request.urlopen(board, timeout=2)
            return False
        except (urllib.error.URLError, ConnectionError):
            return True
    e2e.wait_until(refused, 10, "TensorBoard to stop with shoal ui")
