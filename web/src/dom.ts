// Small DOM helpers. Text from the server (job names, reasons, log lines, the job file) only
// ever enters the page through textContent or createTextNode, never as HTML, so nothing a task
// prints can become markup or script.

type Child = Node | string | number | null | undefined | false;

export interface Attrs {
  [name: string]: string | number | boolean | null | undefined | EventListener;
}

// h("td", {class: "x"}, "text", child): the element, its attributes (`on<event>` functions
// become listeners; false/null/undefined are left out) and its children (strings become text
// nodes).
export function h<K extends keyof HTMLElementTagNameMap>(
    tag: K, attrs: Attrs | null = null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function svg<K extends keyof SVGElementTagNameMap>(
    tag: K, attrs: Attrs | null = null, ...children: Child[]): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el: Element, attrs: Attrs | null): void {
  if (!attrs) return;
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

export function append(el: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
}

// Replaces every child of `el`.
export function replace(el: Node, ...children: Child[]): void {
  while (el.firstChild) el.removeChild(el.firstChild);
  append(el, children);
}

// A link handled by the client-side router (main.ts) rather than a page load.
export function link(href: string, ...children: Child[]): HTMLAnchorElement {
  return h("a", {href, "data-route": true}, ...children);
}

// ---- formatting

export function fmtTime(unixMs: number): string {
  if (!unixMs) return "";
  const d = new Date(unixMs);
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
         `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function fmtDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const whole = Math.floor(s);
  const days = Math.floor(whole / 86400);
  const hours = Math.floor((whole % 86400) / 3600);
  const minutes = Math.floor((whole % 3600) / 60);
  const seconds = whole % 60;
  const p = (n: number) => String(n).padStart(2, "0");
  if (days > 0) return `${days}d ${p(hours)}h`;
  if (hours > 0) return `${hours}h ${p(minutes)}m`;
  return `${minutes}m ${p(seconds)}s`;
}

export function fmtBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function fmtNumber(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "";
  return v.toFixed(digits);
}

// A state as a coloured badge; the class carries the colour (app.css).
export function stateBadge(state: string): HTMLSpanElement {
  return h("span", {class: `state state-${state || "unknown"}`}, state || "unknown");
}

export const TERMINAL_STATES = new Set(["succeeded", "failed", "killed", "lost"]);
