// The job page (`/jobs/<id>`): the header with the job's state and actions, the tasks table,
// the timeline, resource charts, live logs, the job file and its checkpoints. While the job
// runs the page refreshes itself; once it is over, one last refresh and it stops.
import {ApiError, clearError, getJson, JobDetail, jobPath, postJson, reportError, TaskStatus, Timeline} from "./api";
import {ResourceCharts} from "./charts";
import {fmtBytes, fmtDuration, fmtNumber, fmtTime, h, link, replace, stateBadge, TERMINAL_STATES} from "./dom";
import {LogPanel} from "./logs";
import {navigate} from "./router";
import {renderTimeline} from "./timeline";

const REFRESH_MS = 2000;

const SIGNALS: Record<number, string> = {
  1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
  9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
};

function exitOf(t: TaskStatus): string {
  if (t.signal) return `signal ${t.signal}${SIGNALS[t.signal] ? ` (${SIGNALS[t.signal]})` : ""}`;
  // A negative code: the task's end was never reported (its agent or place was lost).
  if ((t.exit_code ?? 0) < 0) return "no exit seen";
  if (TERMINAL_STATES.has(t.state) || t.exit_code) return `exit ${t.exit_code ?? 0}`;
  return "";
}

export function jobPage(app: HTMLElement, id: string): () => void {
  let stopped = false;
  let timer: number | undefined;
  let lastDetail: JobDetail | null = null;
  let finalDone = false;

  const title = h("h1", {class: "job-title"}, id);
  const headState = h("span", {class: "job-state"});
  const facts = h("dl", {class: "facts"});
  const reason = h("p", {class: "job-reason"});
  const actions = h("div", {class: "actions"});
  const actionResult = h("div", {class: "action-result"});
  const tasksBody = h("tbody");
  const timelineBox = h("div", {class: "timeline", id: "timeline"});
  const chartsBox = h("div", {class: "charts", id: "charts"});
  const logsBox = h("div", {class: "logs-panel", id: "logs"});
  const spec = h("pre", {class: "spec", id: "spec"});
  const specSource = h("p", {class: "muted"});
  const checkpoints = h("div", {class: "checkpoints", id: "checkpoints"});

  replace(app,
          h("section", {class: "job-head"},
            h("div", {class: "crumbs"}, link("/", "Jobs"), " / ", h("span", {class: "mono"}, id)),
            h("div", {class: "title-row"}, title, headState),
            reason, facts,
            h("div", {class: "action-row"}, actions, actionResult)),
          h("section", null, h("h2", null, "Tasks"),
            h("table", {class: "grid tasks-table"},
              h("thead", null, h("tr", null,
                ...["Task", "State", "Node", "PID", "Exit", "Restarts", "Last step", "Steps/s", "Reason"].map(
                    (c) => h("th", {class: ["PID", "Restarts", "Last step", "Steps/s"].includes(c) ? "num" : null}, c)))),
              tasksBody)),
          h("section", null, h("h2", null, "Timeline"), timelineBox),
          h("section", null, h("h2", null, "Resources"), chartsBox),
          h("section", null, h("h2", null, "Logs"), logsBox),
          h("div", {class: "two-col"},
            h("section", null, h("h2", null, "Job file"), specSource, spec),
            h("section", null, h("h2", null, "Checkpoints"), checkpoints)));

  const logs = new LogPanel(logsBox, id);
  const charts = new ResourceCharts(chartsBox, id);

  // ---- actions

  let killArmed = false;
  function renderActions(d: JobDetail): void {
    const live = !TERMINAL_STATES.has(d.state);
    const kill = h("button", {type: "button", class: "danger kill", disabled: !live || null,
                              title: live ? "stop every task of the job" : "the job is over"},
                   killArmed ? "Really kill?" : "Kill");
    kill.addEventListener("click", () => {
      // The first click arms, the second kills: no modal dialog, no slip.
      if (!killArmed) {
        killArmed = true;
        renderActions(d);
        window.setTimeout(() => {
          if (killArmed) {
            killArmed = false;
            if (lastDetail) renderActions(lastDetail);
          }
        }, 5000);
        return;
      }
      killArmed = false;
      void act("kill", async () => {
        await postJson(jobPath(id, "kill"));
        actionResult.textContent = "Kill requested.";
        await refresh();
      });
    });
    const rerun = h("button", {type: "button", class: "rerun", title: "run the same job file again"}, "Run again");
    rerun.addEventListener("click", () => void act("rerun", async () => {
      rerun.disabled = true;
      actionResult.textContent = "Starting a new run…";
      const reply = await postJson<{job_id: string}>(jobPath(id, "rerun"));
      navigate(`/jobs/${encodeURIComponent(reply.job_id)}`);
    }, () => { rerun.disabled = false; }));
    const tensorboard = h("button", {type: "button", class: "tensorboard"}, "TensorBoard");
    tensorboard.addEventListener("click", () => void act("tensorboard", async () => {
      tensorboard.disabled = true;
      actionResult.textContent = "Starting TensorBoard…";
      const reply = await postJson<{url: string}>(jobPath(id, "tensorboard"));
      showTensorBoard(reply.url);
    }, () => { tensorboard.disabled = false; }));
    replace(actions, kill, rerun, tensorboard);
  }

  function showTensorBoard(url: string): void {
    replace(actionResult, "TensorBoard: ",
            h("a", {href: url, target: "_blank", rel: "noopener noreferrer", class: "tensorboard-link"}, url));
  }

  async function act(name: string, body: () => Promise<void>, always?: () => void): Promise<void> {
    try {
      await body();
      clearError(`action-${name}`);
    } catch (e) {
      actionResult.textContent = "";
      reportError(`action-${name}`, e);
    } finally {
      if (always) always();
    }
  }

  // ---- the parts from the job's detail

  function renderDetail(d: JobDetail): void {
    title.textContent = d.name || d.job_id;
    replace(headState, stateBadge(d.state));
    reason.textContent = d.reason || "";
    const end = d.finished_unix_ms || Date.now();
    const fact = (k: string, v: Node | string | null | undefined) =>
        v === null || v === undefined || v === "" ? [] : [h("dt", null, k), h("dd", null, v)];
    replace(facts,
            ...fact("ID", h("span", {class: "mono"}, d.job_id)),
            ...fact("Backend", d.backend),
            ...fact("Started", d.created_unix_ms ? fmtTime(d.created_unix_ms) : ""),
            ...fact("Finished", d.finished_unix_ms ? fmtTime(d.finished_unix_ms) : ""),
            ...fact("Duration", d.created_unix_ms ? fmtDuration(end - d.created_unix_ms) : ""),
            ...fact("World size", d.world_size !== undefined ? String(d.world_size) : ""),
            ...fact("Failures", d.failures_total ? String(d.failures_total) : ""));
    renderActions(d);
    if (d.tensorboard && !actionResult.querySelector(".tensorboard-link")) showTensorBoard(d.tensorboard.url);

    const tasks = d.tasks || [];
    if (tasks.length === 0) {
      replace(tasksBody, h("tr", null, h("td", {colspan: 9, class: "empty"}, "No tasks yet.")));
    } else {
      replace(tasksBody, ...tasks.map((t) =>
          h("tr", {"data-task": t.task},
            h("td", {class: "mono"}, t.task || `${t.role}:${t.index}`),
            h("td", null, stateBadge(t.state)),
            h("td", null, t.node || ""),
            h("td", {class: "num"}, t.pid ? String(t.pid) : ""),
            h("td", {class: "nowrap"}, exitOf(t)),
            h("td", {class: "num"}, String(t.restarts ?? 0)),
            h("td", {class: "num"}, t.step !== undefined && t.step !== null ? String(t.step) : ""),
            // Blank for a task that reports no steps (no training SDK), rather than 0.00.
            h("td", {class: "num"}, t.step || t.steps_per_second ? fmtNumber(t.steps_per_second, 2) : ""),
            h("td", {class: "reason"}, t.reason || ""))));
    }
    logs.setTasks(tasks.map((t) => t.task), !TERMINAL_STATES.has(d.state));

    specSource.textContent = d.source_path ? `As submitted from ${d.source_path}:` : "As submitted:";
    // The job file is text: textContent, never markup.
    if (spec.textContent !== d.spec_yaml) spec.textContent = d.spec_yaml;

    if (!d.checkpoints || d.checkpoints.length === 0) {
      replace(checkpoints, h("p", {class: "muted"}, "No checkpoints."));
    } else {
      replace(checkpoints, h("table", {class: "grid"},
          h("thead", null, h("tr", null, h("th", null, "Name"), h("th", null, "Size"), h("th", null, "Saved"))),
          h("tbody", null, ...d.checkpoints.map((c) =>
              h("tr", null, h("td", {class: "mono"}, c.name), h("td", {class: "num"}, fmtBytes(c.bytes)),
                h("td", {class: "nowrap"}, fmtTime(c.mtime_unix_ms)))))));
    }
  }

  // The timeline is drawn to the page's width: again when the window changes.
  let lastTimeline: Timeline | null = null;
  let resizeTimer: number | undefined;
  const onResize = () => {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => { if (lastTimeline) renderTimeline(timelineBox, lastTimeline); }, 150);
  };
  window.addEventListener("resize", onResize);

  async function loadTimeline(): Promise<void> {
    try {
      const timeline = await getJson<Timeline>(jobPath(id, "timeline"));
      if (stopped) return;
      clearError("timeline");
      lastTimeline = timeline;
      renderTimeline(timelineBox, timeline);
    } catch (e) {
      if (stopped) return;
      // A job without a journal yet is normal for a moment: say so in place.
      if (e instanceof ApiError && e.status === 404) {
        replace(timelineBox, h("p", {class: "muted"}, e.message));
      } else {
        reportError("timeline", e);
      }
    }
  }

  async function refresh(): Promise<void> {
    window.clearTimeout(timer);
    let live = true;
    try {
      const d = await getJson<JobDetail>(jobPath(id));
      if (stopped) return;
      clearError("job");
      lastDetail = d;
      live = !TERMINAL_STATES.has(d.state);
      renderDetail(d);
    } catch (e) {
      if (stopped) return;
      reportError("job", e);
      if (e instanceof ApiError && e.status === 404) {
        title.textContent = id;
        replace(headState, stateBadge("unknown"));
        return;  // no such job: nothing to refresh
      }
    }
    await Promise.all([loadTimeline(), charts.load()]);
    if (stopped) return;
    // One more round after the job ends picks up its last records.
    if (live || !finalDone) {
      if (!live) finalDone = true;
      timer = window.setTimeout(() => void refresh(), REFRESH_MS);
    }
  }

  void refresh();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
    window.clearTimeout(resizeTimer);
    window.removeEventListener("resize", onResize);
    logs.stop();
    charts.stop();
  };
}
