// Resource charts from GET /api/jobs/<id>/resources (the samples the agents report, kept in
// the job directory): CPU % and memory per task and for the whole job, and GPU utilisation and
// memory per GPU when the samples have GPUs. Drawn by uPlot on canvases.
import uPlot from "uplot";

import {clearError, getJson, jobPath, reportError, ResourceSample, Resources} from "./api";
import {fmtBytes, h, replace} from "./dom";

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22", "#7f7f7f"];
const CHART_H = 180;

interface SeriesData {
  label: string;
  points: [number, number][];  // [unix seconds, value]
}

interface ChartSpec {
  key: string;
  title: string;
  unit: "percent" | "bytes";
  series: SeriesData[];
  total: boolean;  // add a job total (sum over the series)
}

// Aligns series of their own timestamps on one x axis; a gap is null.
function align(series: SeriesData[]): uPlot.AlignedData {
  const tables: uPlot.AlignedData[] = series.map((s) => [s.points.map((p) => p[0]), s.points.map((p) => p[1])]);
  if (tables.length === 1) return tables[0];
  return uPlot.join(tables);
}

// The job's total at each x: each series' latest value at or before x, within that series'
// own span (a task that ended adds nothing after its last sample).
function totalOf(data: uPlot.AlignedData): (number | null)[] {
  const xs = data[0] as number[];
  const out: (number | null)[] = [];
  const last: (number | null)[] = new Array(data.length).fill(null);
  const ends = data.slice(1).map((ys) => {
    let end = -1;
    (ys as (number | null | undefined)[]).forEach((y, i) => { if (y !== null && y !== undefined) end = i; });
    return end;
  });
  for (let i = 0; i < xs.length; i++) {
    let sum = 0;
    let any = false;
    for (let s = 1; s < data.length; s++) {
      const y = (data[s] as (number | null | undefined)[])[i];
      if (y !== null && y !== undefined) last[s] = y;
      if (last[s] !== null && i <= ends[s - 1]) {
        sum += last[s] as number;
        any = true;
      }
    }
    out.push(any ? sum : null);
  }
  return out;
}

function specsOf(resources: Resources): ChartSpec[] {
  const tasks = Object.keys(resources.tasks).sort();
  const per = (f: (s: ResourceSample) => number | undefined) => tasks.map((task) => ({
    label: task,
    points: resources.tasks[task].filter((s) => f(s) !== undefined && s.ts_ms)
                                  .map((s) => [s.ts_ms / 1000, f(s) as number] as [number, number]),
  })).filter((s) => s.points.length > 0);
  const specs: ChartSpec[] = [
    {key: "cpu", title: "CPU (% of one core)", unit: "percent", series: per((s) => s.cpu_percent), total: tasks.length > 1},
    {key: "memory", title: "Memory (RSS)", unit: "bytes", series: per((s) => s.rss_bytes), total: tasks.length > 1},
  ];
  // GPUs: one series per task and GPU index.
  const gpuSeries = (f: (g: NonNullable<ResourceSample["gpus"]>[number]) => number | undefined) => {
    const out: SeriesData[] = [];
    for (const task of tasks) {
      const byIndex = new Map<number, [number, number][]>();
      for (const s of resources.tasks[task]) {
        for (const g of s.gpus || []) {
          const v = f(g);
          if (v === undefined || v === null) continue;
          if (!byIndex.has(g.index)) byIndex.set(g.index, []);
          byIndex.get(g.index)!.push([s.ts_ms / 1000, v]);
        }
      }
      for (const [index, points] of [...byIndex.entries()].sort((a, b) => a[0] - b[0])) {
        out.push({label: `${task} gpu${index}`, points});
      }
    }
    return out;
  };
  const gpuUtil = gpuSeries((g) => g.util_percent);
  const gpuMemory = gpuSeries((g) => g.memory_bytes);
  if (gpuUtil.length) specs.push({key: "gpu-util", title: "GPU utilisation (%)", unit: "percent", series: gpuUtil, total: false});
  if (gpuMemory.length) specs.push({key: "gpu-memory", title: "GPU memory", unit: "bytes", series: gpuMemory, total: gpuMemory.length > 1});
  return specs.filter((s) => s.series.length > 0);
}

class Chart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private shape = "";

  constructor(readonly key: string) {
    this.el = h("div", {class: "chart", "data-chart": key});
  }

  update(spec: ChartSpec, width: number): void {
    const data = align(spec.series);
    const labels = spec.series.map((s) => s.label);
    const all: uPlot.AlignedData = spec.total && spec.series.length > 1
        ? [...data, totalOf(data)] as uPlot.AlignedData : data;
    if (spec.total && spec.series.length > 1) labels.push("job total");
    const shape = `${spec.title}|${labels.join(",")}`;
    this.el.dataset.points = String((all[0] as number[]).length);
    if (this.plot && shape === this.shape) {
      this.plot.setData(all);
      return;
    }
    this.destroy();
    this.shape = shape;
    const format = spec.unit === "bytes" ? (v: number) => fmtBytes(v) : (v: number) => `${v.toFixed(0)}%`;
    const opts: uPlot.Options = {
      title: spec.title,
      width,
      height: CHART_H,
      scales: {x: {time: true}, y: {range: (_u, min, max) => [0, Math.max(max, spec.unit === "percent" ? 100 : 1)]}},
      series: [
        {},
        ...labels.map((label, i) => ({
          label,
          stroke: label === "job total" ? "#24292f" : PALETTE[i % PALETTE.length],
          width: label === "job total" ? 2 : 1.5,
          dash: label === "job total" ? [6, 4] : undefined,
          spanGaps: true,
          points: {show: false},
          value: (_u: uPlot, v: number | null) => (v === null || v === undefined ? "—" : format(v)),
        })),
      ],
      axes: [
        {},
        {size: 64, values: (_u, splits) => splits.map((v) => (v === null ? "" : format(v)))},
      ],
      legend: {live: true},
    };
    this.plot = new uPlot(opts, all, this.el);
  }

  resize(width: number): void {
    if (this.plot) this.plot.setSize({width, height: CHART_H});
  }

  destroy(): void {
    if (this.plot) {
      this.plot.destroy();
      this.plot = null;
    }
    this.shape = "";
  }
}

export class ResourceCharts {
  private readonly charts = new Map<string, Chart>();
  private readonly grid = h("div", {class: "chart-grid"});
  private readonly empty = h("p", {class: "muted no-samples"},
      "No resource samples: the agents take one every 2 s while a task runs.");
  private stopped = false;
  private readonly onResize = () => {
    const width = this.chartWidth();
    for (const c of this.charts.values()) c.resize(width);
  };

  constructor(private readonly box: HTMLElement, private readonly jobId: string) {
    replace(box, this.empty, this.grid);
    window.addEventListener("resize", this.onResize);
  }

  private chartWidth(): number {
    const full = this.box.clientWidth || 900;
    return full >= 900 ? Math.floor((full - 16) / 2) : full;
  }

  async load(): Promise<void> {
    let resources: Resources;
    try {
      resources = await getJson<Resources>(jobPath(this.jobId, "resources"));
    } catch (e) {
      if (!this.stopped) reportError("resources", e);
      return;
    }
    if (this.stopped) return;
    clearError("resources");
    const specs = specsOf(resources);
    this.empty.hidden = specs.length > 0;
    const wanted = new Set(specs.map((s) => s.key));
    for (const [key, chart] of this.charts) {
      if (!wanted.has(key)) {
        chart.destroy();
        chart.el.remove();
        this.charts.delete(key);
      }
    }
    const width = this.chartWidth();
    for (const spec of specs) {
      let chart = this.charts.get(spec.key);
      if (!chart) {
        chart = new Chart(spec.key);
        this.charts.set(spec.key, chart);
        this.grid.appendChild(chart.el);
      }
      chart.update(spec, width);
    }
  }

  stop(): void {
    this.stopped = true;
    window.removeEventListener("resize", this.onResize);
    for (const c of this.charts.values()) c.destroy();
    this.charts.clear();
  }
}
