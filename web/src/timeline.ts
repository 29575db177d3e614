// The job's timeline, drawn as SVG from GET /api/jobs/<id>/timeline: x is time, the phases
// band on top (queued, admission, starting, running, ...), a step line of the world size, then
// one row per task with a bar per generation coloured by how it ended, and markers for
// failures, restarts, checkpoints and the other journal events. Every label is a text node.
import {Timeline, TimelineEvent} from "./api";
import {fmtDuration, fmtTime, h, replace, svg} from "./dom";

const LABEL_W = 120;
const RIGHT_PAD = 16;
const ROW_H = 20;
const BAR_H = 14;
const WORLD_H = 34;
const AXIS_H = 22;

// The marker of each event kind: a shape the legend explains.
const MARKERS: Record<string, {label: string; shape: "cross" | "circle" | "diamond" | "triangle" | "tick" | "square"}> = {
  failure: {label: "failure", shape: "cross"},
  restart: {label: "restart", shape: "circle"},
  checkpoint_saved: {label: "checkpoint saved", shape: "diamond"},
  checkpoint_resumed: {label: "resumed from checkpoint", shape: "triangle"},
  model_published: {label: "model published", shape: "diamond"},
  hung: {label: "hung", shape: "square"},
  world: {label: "world change", shape: "tick"},
  agent_lost: {label: "agent lost", shape: "square"},
  kill: {label: "kill requested", shape: "cross"},
  master_recovered: {label: "master recovered", shape: "circle"},
};

// Tick spacing for the time axis: a step that gives about 6-10 ticks.
const TICK_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                      21600, 43200, 86400];

function clock(s: number): string {
  const whole = Math.round(s);
  const hours = Math.floor(whole / 3600);
  const minutes = Math.floor((whole % 3600) / 60);
  const seconds = whole % 60;
  const p = (n: number) => String(n).padStart(2, "0");
  return hours > 0 ? `${hours}:${p(minutes)}:${p(seconds)}` : `${minutes}:${p(seconds)}`;
}

function markerShape(kind: string, x: number, y: number): SVGElement {
  const shape = (MARKERS[kind] || {shape: "tick"}).shape;
  const r = 5;
  const cls = `marker marker-${kind}`;
  switch (shape) {
    case "cross":
      return svg("path", {class: cls, d: `M${x - r},${y - r}L${x + r},${y + r}M${x - r},${y + r}L${x + r},${y - r}`});
    case "circle":
      return svg("circle", {class: cls, cx: x, cy: y, r: r - 0.5});
    case "diamond":
      return svg("path", {class: cls, d: `M${x},${y - r}L${x + r},${y}L${x},${y + r}L${x - r},${y}Z`});
    case "triangle":
      return svg("path", {class: cls, d: `M${x},${y - r}L${x + r},${y + r}L${x - r},${y + r}Z`});
    case "square":
      return svg("rect", {class: cls, x: x - r + 1, y: y - r + 1, width: 2 * r - 2, height: 2 * r - 2});
    default:
      return svg("path", {class: cls, d: `M${x},${y - r - 2}L${x},${y + r + 2}`});
  }
}

export function renderTimeline(box: HTMLElement, t: Timeline): void {
  const wasOpen = box.querySelector("details")?.open ?? false;
  const start = t.start_unix_ms || t.now_unix_ms;
  const end = Math.max(t.end_unix_ms || t.now_unix_ms, start + 1000);
  const width = Math.max(box.clientWidth || 900, 600);
  const plotW = width - LABEL_W - RIGHT_PAD;
  const x = (ms: number) => LABEL_W + ((Math.min(Math.max(ms, start), end) - start) / (end - start)) * plotW;

  const jobEvents = t.events.filter((e) => !e.task || !t.tasks.some((row) => row.task === e.task));
  const hasWorld = t.world_size.length > 0;
  const phasesY = 0;
  const jobRowY = phasesY + ROW_H + 2;
  const worldY = jobRowY + ROW_H;
  const tasksY = worldY + (hasWorld ? WORLD_H + 4 : 0);
  const axisY = tasksY + t.tasks.length * ROW_H + 4;
  const height = axisY + AXIS_H;

  const root = svg("svg", {class: "timeline-svg", width, height, viewBox: `0 0 ${width} ${height}`,
                           role: "img", "aria-label": "job timeline"});

  // The axis first: its grid lines sit under everything else.
  const span = (end - start) / 1000;
  const step = TICK_STEPS_S.find((s) => span / s <= 10) || 86400 * Math.ceil(span / 86400 / 10);
  const axis = svg("g", {class: "axis"});
  for (let s = 0; s <= span + 1e-9; s += step) {
    const tx = x(start + s * 1000);
    axis.appendChild(svg("line", {class: "grid-line", x1: tx, x2: tx, y1: phasesY, y2: axisY}));
    axis.appendChild(svg("text", {x: tx, y: axisY + 14, "text-anchor": "middle"}, clock(s)));
  }
  axis.appendChild(svg("line", {class: "axis-line", x1: LABEL_W, x2: LABEL_W + plotW, y1: axisY, y2: axisY}));
  root.appendChild(axis);

  // Phases.
  const phases = svg("g", {class: "phases"});
  phases.appendChild(svg("text", {class: "row-label", x: 4, y: phasesY + 14}, "phase"));
  for (const p of t.phases) {
    const px = x(p.from_ms);
    const pw = Math.max(x(p.to_ms || end) - px, 1);
    const g = svg("g", {class: "phase", "data-phase": p.name});
    g.appendChild(svg("rect", {class: `phase-bar phase-${p.name}`, x: px, y: phasesY + 2, width: pw, height: ROW_H - 4},
                      svg("title", null, `${p.name}: ${fmtTime(p.from_ms)}, ${fmtDuration((p.to_ms || end) - p.from_ms)}`)));
    if (pw > p.name.length * 7 + 6) {
      g.appendChild(svg("text", {class: "phase-label", x: px + 4, y: phasesY + 14}, p.name));
    }
    phases.appendChild(g);
  }
  root.appendChild(phases);

  // The job's own events (those of no task row).
  const jobRow = svg("g", {class: "job-events"});
  jobRow.appendChild(svg("text", {class: "row-label", x: 4, y: jobRowY + 14}, "job"));
  for (const e of jobEvents) jobRow.appendChild(marker(e, x(e.ts_ms), jobRowY + ROW_H / 2));
  root.appendChild(jobRow);

  // The world size over time, a step line.
  if (hasWorld) {
    const most = Math.max(...t.world_size.map(([, n]) => n), 1);
    const y = (n: number) => worldY + WORLD_H - 4 - (n / most) * (WORLD_H - 10);
    let d = "";
    let prevY = 0;
    t.world_size.forEach(([ts, n], i) => {
      const px = x(ts);
      d += i === 0 ? `M${px},${y(n)}` : `L${px},${prevY}L${px},${y(n)}`;
      prevY = y(n);
    });
    d += `L${x(end)},${prevY}`;
    const world = svg("g", {class: "world"});
    world.appendChild(svg("text", {class: "row-label", x: 4, y: worldY + WORLD_H / 2 + 4}, "world size"));
    world.appendChild(svg("path", {class: "world-line", d}));
    let lastN = -1;
    for (const [ts, n] of t.world_size) {
      if (n === lastN) continue;
      lastN = n;
      world.appendChild(svg("text", {class: "world-label", x: x(ts) + 3, y: y(n) - 3}, String(n)));
    }
    root.appendChild(world);
  }

  // One row per task: its generations and its events.
  t.tasks.forEach((row, i) => {
    const ry = tasksY + i * ROW_H;
    const g = svg("g", {class: "task-row", "data-task": row.task});
    if (i % 2 === 1) g.appendChild(svg("rect", {class: "row-shade", x: 0, y: ry, width, height: ROW_H}));
    g.appendChild(svg("text", {class: "row-label mono", x: 4, y: ry + 14}, row.task));
    for (const gen of row.generations) {
      const gx = x(gen.from_ms);
      const gw = Math.max(x(gen.to_ms || end) - gx, 2);
      const how = gen.signal ? `signal ${gen.signal}` : gen.to_ms ? `exit ${gen.exit_code}` : "still running";
      const text = `${row.task} attempt ${gen.attempt}: ${gen.state} (${how})` +
                   `${gen.reason ? ", " + gen.reason : ""}${gen.node ? ", on " + gen.node : ""}; ` +
                   `${fmtTime(gen.from_ms)}, ${fmtDuration((gen.to_ms || end) - gen.from_ms)}`;
      g.appendChild(svg("rect", {class: `gen state-${gen.state}`, "data-task": row.task, "data-attempt": gen.attempt,
                                 "data-state": gen.state, x: gx, y: ry + (ROW_H - BAR_H) / 2, width: gw,
                                 height: BAR_H, rx: 2}, svg("title", null, text)));
    }
    for (const e of t.events.filter((ev) => ev.task === row.task)) g.appendChild(marker(e, x(e.ts_ms), ry + ROW_H / 2));
    root.appendChild(g);
  });

  const kinds = [...new Set(t.events.map((e) => e.kind))];
  const states = [...new Set(t.tasks.flatMap((row) => row.generations.map((g) => g.state)))];
  const legend = h("div", {class: "legend"},
                   ...states.map((s) => h("span", {class: "legend-item"}, h("span", {class: `swatch state-${s}`}), s)),
                   ...kinds.map((k) => {
                     const icon = svg("svg", {width: 14, height: 14, class: "legend-marker"}, markerShape(k, 7, 7));
                     return h("span", {class: "legend-item"}, icon, (MARKERS[k] || {label: k}).label);
                   }),
                   h("span", {class: "legend-item muted"}, `from ${fmtTime(start)}`));

  const details = h("details", {class: "events", open: wasOpen},
                    h("summary", null, `Events (${t.events.length})`),
                    h("table", {class: "grid"},
                      h("tbody", null, ...t.events.map((e) =>
                          h("tr", {class: `event event-${e.kind}`},
                            h("td", {class: "nowrap"}, clock((e.ts_ms - start) / 1000)),
                            h("td", null, e.kind), h("td", {class: "mono"}, e.task || ""),
                            h("td", null, e.text))))));

  replace(box, root, legend,
          t.truncated ? h("p", {class: "muted"}, "The journal's last line was partly written; it is left out.") : null,
          t.events.length ? details : null,
          t.tasks.length === 0 ? h("p", {class: "muted"}, "No task has started yet.") : null);
}

function marker(e: TimelineEvent, mx: number, my: number): SVGElement {
  // A restart is journalled with the failure that caused it: beside it, not over it.
  if (e.kind === "restart") mx += 8;
  const g = svg("g", {class: `event-marker kind-${e.kind}`, "data-kind": e.kind, "data-task": e.task || ""},
                markerShape(e.kind, mx, my));
  g.appendChild(svg("title", null, `${fmtTime(e.ts_ms)} ${e.text}`));
  return g;
}
