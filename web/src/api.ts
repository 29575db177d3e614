// Fetch helpers for the dashboard's HTTP API (docs/design/0014-web-ui.md) and the error
// banner that shows what the API refused.
import {h, replace} from "./dom";

export class ApiError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

async function errorOf(response: Response): Promise<ApiError> {
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") message = body.error;
  } catch {
    // Not JSON: the status says enough.
  }
  return new ApiError(response.status, message);
}

async function send<T>(path: string, init: RequestInit): Promise<T> {
  let response: Response;
  try {
    response = await fetch(path, {credentials: "same-origin", ...init});
  } catch (e) {
    throw new ApiError(0, `cannot reach the dashboard's server (${path}): ${e}`);
  }
  if (response.status === 401) {
    // The session ended (a token was set): sign in again.
    window.location.assign("/login");
  }
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as T;
}

export function getJson<T>(path: string): Promise<T> {
  return send<T>(path, {method: "GET", headers: {"Accept": "application/json"}});
}

// Every state-changing request carries X-Shoal-Request: the server refuses POSTs without it
// (a cross-site form cannot send it).
export function postJson<T>(path: string): Promise<T> {
  return send<T>(path, {method: "POST", headers: {"X-Shoal-Request": "1", "Accept": "application/json"}});
}

// ---- the banner: one message per source (a page's refresh, an action), each cleared when
// that source succeeds again or the user dismisses it.

const errors = new Map<string, string>();

function banner(): HTMLElement | null {
  return document.getElementById("banner");
}

function renderBanner(): void {
  const el = banner();
  if (!el) return;
  if (errors.size === 0) {
    el.hidden = true;
    replace(el);
    return;
  }
  el.hidden = false;
  replace(el, ...[...errors.entries()].map(([source, message]) =>
      h("div", {class: "banner-line", "data-source": source},
        h("span", {class: "banner-text"}, message),
        h("button", {type: "button", class: "banner-close", title: "dismiss",
                     onclick: () => clearError(source)}, "×"))));
}

export function reportError(source: string, e: unknown): void {
  const message = e instanceof Error ? e.message : String(e);
  errors.set(source, message);
  renderBanner();
}

export function clearError(source: string): void {
  if (errors.delete(source)) renderBanner();
}

export function clearAllErrors(): void {
  errors.clear();
  renderBanner();
}

// ---- the API's shapes

export interface JobRow {
  job_id: string;
  name: string;
  state: string;
  backend: string;
  tasks: number;
  restarts: number;
  created_unix_ms: number;
  finished_unix_ms: number;
  duration_ms: number;
  reason: string;
}

export interface JobList {
  total: number;
  page: number;
  per_page: number;
  states: Record<string, number>;
  jobs: JobRow[];
}

export interface TaskStatus {
  task: string;
  role: string;
  index: number;
  state: string;
  node?: string;
  pid?: number;
  exit_code?: number;
  signal?: number;
  restarts?: number;
  step?: number;
  reason?: string;
  steps_per_second?: number | null;
}

export interface JobDetail {
  job_id: string;
  name: string;
  state: string;
  reason?: string;
  backend: string;
  source_path: string;
  spec_yaml: string;
  created_unix_ms?: number;
  finished_unix_ms?: number;
  tasks?: TaskStatus[];
  checkpoints: {name: string; bytes: number; mtime_unix_ms: number}[];
  tensorboard: {url: string} | null;
  world_size?: number;
  generation?: number;
  failures_total?: number;
}

export interface Generation {
  attempt: number;
  from_ms: number;
  to_ms: number;
  state: string;
  exit_code: number;
  signal: number;
  reason: string;
  node: string;
}

export interface TimelineEvent {
  ts_ms: number;
  kind: string;
  task?: string;
  text: string;
}

export interface Timeline {
  start_unix_ms: number;
  end_unix_ms: number;
  now_unix_ms: number;
  truncated: boolean;
  phases: {name: string; from_ms: number; to_ms: number}[];
  tasks: {task: string; generations: Generation[]}[];
  events: TimelineEvent[];
  world_size: [number, number][];
}

export interface LogLine {
  offset: number;
  task: string;
  text: string;
}

export interface LogPage {
  lines: LogLine[];
  start_offset: number;
  end_offset: number;
  file_size: number;
  more_before: boolean;
}

export interface GpuSample {
  index: number;
  util_percent?: number;
  memory_bytes?: number;
}

export interface ResourceSample {
  ts_ms: number;
  cpu_percent?: number;
  rss_bytes?: number;
  step?: number;
  attempt?: number;
  gpus?: GpuSample[];
}

export interface Resources {
  tasks: Record<string, ResourceSample[]>;
}

export interface ModelsReply {
  servers: {
    url: string;
    ready: boolean;
    error: string | null;
    models: {
      name: string;
      versions: {version: string; state: string; reason?: string}[];
      requests_per_second: number | null;
      requests_total?: number;
      latency_ms: {p50?: number; p90?: number; p99?: number};
      mean_batch_size: number | null;
      errors: number;
    }[];
  }[];
}

export function jobPath(id: string, what = ""): string {
  return `/api/jobs/${encodeURIComponent(id)}${what ? "/" + what : ""}`;
}
