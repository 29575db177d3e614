// The live logs panel: the last lines of the job's logs.txt (GET .../logs), older pages on
// demand (before=<start_offset>), a task filter, and follow mode on server-sent events
// (GET .../logs/follow?from=<end_offset>). A line is always put in as text (textContent),
// never as HTML: whatever a task prints shows literally and runs nothing.
import {clearError, getJson, jobPath, LogLine, LogPage, reportError} from "./api";
import {h, replace} from "./dom";

const PAGE_LINES = 200;
const MAX_LINES = 10000;  // beyond this the oldest lines leave the page (older brings them back)
const RETRY_MS = 1000;

export class LogPanel {
  private readonly select = h("select", {class: "log-task", "aria-label": "task filter"},
                              h("option", {value: ""}, "all tasks"));
  private readonly olderButton = h("button", {type: "button", class: "log-older"}, "↑ older");
  private readonly followBox = h("input", {type: "checkbox", class: "log-follow"});
  private readonly status = h("span", {class: "log-status muted"});
  private readonly view = h("div", {class: "log-lines", tabindex: 0, role: "log", "aria-live": "off"});
  private tasks: string[] = [];
  private started = false;
  private stopped = false;
  private olderOffset = 0;
  private moreBefore = false;
  private endOffset = 0;
  private source: EventSource | null = null;
  private retry: number | undefined;
  private ended = false;
  private loadGeneration = 0;
  private count = 0;

  constructor(box: HTMLElement, private readonly jobId: string) {
    replace(box,
            h("div", {class: "log-controls"},
              h("label", null, "Task ", this.select),
              this.olderButton,
              h("label", {class: "follow-label"}, this.followBox, " follow"),
              this.status),
            this.view);
    this.select.addEventListener("change", () => void this.reload());
    this.olderButton.addEventListener("click", () => void this.older());
    this.followBox.addEventListener("change", () => {
      if (this.followBox.checked) {
        this.startFollow();
        this.scrollToEnd();
      } else {
        this.stopFollow();
        this.status.textContent = "not following";
      }
    });
  }

  // Called with every refresh of the job: the task list (for the filter) and whether the job
  // is still live. The first call loads the last page, and follows a live job.
  setTasks(tasks: string[], live: boolean): void {
    const known = new Set(this.tasks);
    for (const t of tasks) {
      if (!known.has(t)) {
        this.tasks.push(t);
        this.select.appendChild(h("option", {value: t}, t));
      }
    }
    if (!this.started) {
      this.started = true;
      this.followBox.checked = live;
      void this.reload();
    }
  }

  stop(): void {
    this.stopped = true;
    this.stopFollow();
  }

  private task(): string {
    return this.select.value;
  }

  private url(what: string, params: Record<string, string | number>): string {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) p.set(k, String(v));
    if (this.task()) p.set("task", this.task());
    return `${jobPath(this.jobId, what)}?${p}`;
  }

  private async reload(): Promise<void> {
    const mine = ++this.loadGeneration;
    this.stopFollow();
    this.ended = false;
    try {
      const page = await getJson<LogPage>(this.url("logs", {limit: PAGE_LINES}));
      if (this.stopped || mine !== this.loadGeneration) return;
      clearError("logs");
      replace(this.view);
      this.count = 0;
      this.view.classList.toggle("one-task", this.task() !== "");
      this.appendLines(page.lines);
      this.olderOffset = page.start_offset;
      this.moreBefore = page.more_before;
      this.endOffset = page.end_offset;
      this.olderButton.disabled = !this.moreBefore;
      if (page.lines.length === 0) this.status.textContent = "no lines yet";
      this.scrollToEnd();
      if (this.followBox.checked) this.startFollow();
      else this.status.textContent = `${this.count} lines`;
    } catch (e) {
      if (!this.stopped) reportError("logs", e);
    }
  }

  private async older(): Promise<void> {
    if (!this.moreBefore) return;
    this.olderButton.disabled = true;
    const mine = this.loadGeneration;
    try {
      const page = await getJson<LogPage>(this.url("logs", {before: this.olderOffset, limit: PAGE_LINES}));
      if (this.stopped || mine !== this.loadGeneration) return;
      clearError("logs");
      // Keep what the reader looks at in place while lines arrive above it.
      const fromBottom = this.view.scrollHeight - this.view.scrollTop;
      const fragment = document.createDocumentFragment();
      for (const line of page.lines) fragment.appendChild(this.lineElement(line));
      this.view.insertBefore(fragment, this.view.firstChild);
      this.count += page.lines.length;
      this.view.scrollTop = this.view.scrollHeight - fromBottom;
      this.olderOffset = page.start_offset;
      this.moreBefore = page.more_before;
      if (!this.source && !this.ended) this.status.textContent = `${this.count} lines`;
    } catch (e) {
      reportError("logs", e);
    }
    this.olderButton.disabled = !this.moreBefore;
  }

  private lineElement(line: LogLine): HTMLElement {
    const el = h("div", {class: "log-line"});
    el.dataset.offset = String(line.offset);
    if (line.task) {
      const index = this.tasks.indexOf(line.task);
      const task = h("span", {class: `log-task-name c${(index < 0 ? 0 : index) % 8}`});
      task.textContent = line.task;
      el.appendChild(task);
    }
    const text = h("span", {class: "log-text"});
    text.textContent = line.text;
    el.appendChild(text);
    return el;
  }

  private atEnd(): boolean {
    return this.view.scrollHeight - this.view.scrollTop - this.view.clientHeight < 40;
  }

  private scrollToEnd(): void {
    this.view.scrollTop = this.view.scrollHeight;
  }

  private appendLines(lines: LogLine[]): void {
    if (lines.length === 0) return;
    const stick = this.atEnd();
    const fragment = document.createDocumentFragment();
    for (const line of lines) fragment.appendChild(this.lineElement(line));
    this.view.appendChild(fragment);
    this.count += lines.length;
    // A bounded page: the oldest lines go, and "older" brings them back from the file.
    while (this.count > MAX_LINES && this.view.firstElementChild) {
      this.view.removeChild(this.view.firstElementChild);
      this.count--;
      const first = this.view.firstElementChild as HTMLElement | null;
      if (first?.dataset.offset) {
        this.olderOffset = Number(first.dataset.offset);
        this.moreBefore = true;
        this.olderButton.disabled = false;
      }
    }
    // Auto-scroll while following, unless the reader scrolled up to read.
    if (this.followBox.checked && stick) this.scrollToEnd();
  }

  private startFollow(): void {
    this.stopFollow();
    if (this.ended || this.stopped) {
      this.status.textContent = "the job is over: every line is shown";
      return;
    }
    const source = new EventSource(this.url("logs/follow", {from: this.endOffset}));
    this.source = source;
    this.status.textContent = "following…";
    source.addEventListener("lines", (event) => {
      const data = JSON.parse((event as MessageEvent).data) as {lines: LogLine[]; end_offset: number};
      this.endOffset = data.end_offset;
      this.appendLines(data.lines);
    });
    source.addEventListener("end", (event) => {
      const data = JSON.parse((event as MessageEvent).data) as {end_offset: number};
      this.endOffset = data.end_offset;
      this.ended = true;
      this.stopFollow();
      this.status.textContent = "the job is over: every line is shown";
    });
    source.addEventListener("error", () => {
      // EventSource would reconnect on its own, but from the offset it first asked for: close
      // it and reconnect from where the lines got to.
      if (this.source !== source) return;
      this.stopFollow();
      if (!this.followBox.checked || this.ended || this.stopped) return;
      this.status.textContent = "reconnecting…";
      this.retry = window.setTimeout(() => this.startFollow(), RETRY_MS);
    });
  }

  private stopFollow(): void {
    window.clearTimeout(this.retry);
    if (this.source) {
      this.source.close();
      this.source = null;
    }
  }
}
