// The jobs page (`/`): every job in the jobs directory, filtered by state and text, sorted and
// paged by the server (GET /api/jobs). The filters live in the URL's query, so a reload or a
// shared link shows the same list; the list refreshes itself every few seconds.
import {clearError, getJson, JobList, JobRow, reportError} from "./api";
import {fmtDuration, fmtTime, h, link, replace, stateBadge} from "./dom";
import {setQuery} from "./router";

const STATES = ["queued", "starting", "running", "stopping", "succeeded", "failed", "killed",
                "lost", "unknown"];
const REFRESH_MS = 3000;
const PER_PAGE_CHOICES = [25, 50, 100, 200, 500];

interface Column {
  label: string;
  sort?: string;  // the API's sort key, when the column sorts
  cell: (job: JobRow) => Node | string;
  cls?: string;
}

const COLUMNS: Column[] = [
  {label: "Name", sort: "name", cell: (j) => link(`/jobs/${encodeURIComponent(j.job_id)}`, j.name || j.job_id)},
  {label: "ID", cell: (j) => link(`/jobs/${encodeURIComponent(j.job_id)}`, j.job_id), cls: "mono nowrap"},
  {label: "State", sort: "state", cell: (j) => stateBadge(j.state)},
  {label: "Backend", cell: (j) => j.backend},
  {label: "Tasks", cell: (j) => String(j.tasks), cls: "num"},
  {label: "Restarts", sort: "restarts", cell: (j) => String(j.restarts), cls: "num"},
  {label: "Start", sort: "created", cell: (j) => fmtTime(j.created_unix_ms), cls: "nowrap"},
  {label: "Duration", sort: "duration", cell: (j) => fmtDuration(j.duration_ms), cls: "num nowrap"},
  {label: "Reason", cell: (j) => j.reason, cls: "reason"},
];

interface Filters {
  states: string[];
  q: string;
  sort: string;
  page: number;
  perPage: number;
}

function filtersFromUrl(): Filters {
  const p = new URLSearchParams(window.location.search);
  const page = parseInt(p.get("page") || "1", 10);
  const perPage = parseInt(p.get("per_page") || "50", 10);
  return {
    states: (p.get("state") || "").split(",").filter((s) => s),
    q: p.get("q") || "",
    sort: p.get("sort") || "-created",
    page: Number.isFinite(page) && page > 0 ? page : 1,
    perPage: Number.isFinite(perPage) && perPage > 0 ? perPage : 50,
  };
}

function queryOf(f: Filters): URLSearchParams {
  const p = new URLSearchParams();
  if (f.states.length) p.set("state", f.states.join(","));
  if (f.q) p.set("q", f.q);
  if (f.sort !== "-created") p.set("sort", f.sort);
  if (f.page !== 1) p.set("page", String(f.page));
  if (f.perPage !== 50) p.set("per_page", String(f.perPage));
  return p;
}

export function jobsPage(app: HTMLElement): () => void {
  const filters = filtersFromUrl();
  let timer: number | undefined;
  let debounce: number | undefined;
  let generation = 0;  // answers to older requests are dropped
  let stopped = false;
  let lastText = "";

  const stateButtons = h("div", {class: "state-filters", role: "group", "aria-label": "filter by state"});
  const search = h("input", {type: "search", placeholder: "filter by id, name or reason",
                             class: "search", "aria-label": "text filter", value: filters.q});
  const summary = h("span", {class: "summary"});
  const head = h("tr");
  const body = h("tbody");
  const pager = h("div", {class: "pager"});
  replace(app,
          h("section", {class: "jobs"},
            h("div", {class: "toolbar"}, stateButtons, search, summary),
            h("table", {class: "grid jobs-table"}, h("thead", null, head), body),
            pager));

  search.addEventListener("input", () => {
    window.clearTimeout(debounce);
    debounce = window.setTimeout(() => {
      filters.q = search.value.trim();
      filters.page = 1;
      changed();
    }, 250);
  });

  function changed(): void {
    setQuery(queryOf(filters));
    void load();
  }

  function renderHead(): void {
    const active = filters.sort.replace(/^-/, "");
    const descending = filters.sort.startsWith("-");
    replace(head, ...COLUMNS.map((c) => {
      if (!c.sort) return h("th", {class: c.cls}, c.label);
      const key = c.sort;
      const arrow = active === key ? (descending ? " ▼" : " ▲") : "";
      return h("th", {class: `${c.cls || ""} sortable`, "data-sort": key,
                      "aria-sort": active === key ? (descending ? "descending" : "ascending") : "none"},
               h("button", {type: "button", class: "link-button", onclick: () => {
                 // A new column starts descending for numbers and times, ascending for text.
                 if (active === key) {
                   filters.sort = descending ? key : `-${key}`;
                 } else {
                   filters.sort = key === "name" || key === "state" ? key : `-${key}`;
                 }
                 filters.page = 1;
                 renderHead();
                 changed();
               }}, c.label + arrow));
    }));
  }

  function renderStates(counts: Record<string, number>): void {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const shown = STATES.filter((s) => (counts[s] || 0) > 0 || filters.states.includes(s));
    for (const s of Object.keys(counts)) if (!shown.includes(s)) shown.push(s);
    const button = (label: string, count: number, pressed: boolean, onclick: () => void, state: string) =>
        h("button", {type: "button", class: "filter", "data-state": state, "aria-pressed": pressed ? "true" : "false",
                     onclick},
          state ? h("span", {class: `dot state-${state}`}) : null, `${label} `,
          h("span", {class: "count"}, String(count)));
    replace(stateButtons,
            button("all", total, filters.states.length === 0, () => {
              filters.states = [];
              filters.page = 1;
              changed();
            }, ""),
            ...shown.map((s) => button(s, counts[s] || 0, filters.states.includes(s), () => {
              filters.states = filters.states.includes(s) ? filters.states.filter((x) => x !== s)
                                                          : [...filters.states, s];
              filters.page = 1;
              changed();
            }, s)));
  }

  function renderPager(list: JobList): void {
    const pages = Math.max(1, Math.ceil(list.total / list.per_page));
    const go = (page: number) => () => {
      filters.page = page;
      changed();
    };
    const perPage = h("select", {"aria-label": "jobs per page"},
                      ...PER_PAGE_CHOICES.map((n) => h("option", {value: n, selected: n === filters.perPage}, `${n} per page`)));
    perPage.addEventListener("change", () => {
      filters.perPage = parseInt(perPage.value, 10);
      filters.page = 1;
      changed();
    });
    replace(pager,
            h("button", {type: "button", class: "page-prev", disabled: list.page <= 1, onclick: go(list.page - 1)}, "‹ newer"),
            h("span", {class: "page-of"}, `page ${list.page} of ${pages}`),
            h("button", {type: "button", class: "page-next", disabled: list.page >= pages, onclick: go(list.page + 1)}, "older ›"),
            perPage);
  }

  function renderRows(list: JobList): void {
    if (list.jobs.length === 0) {
      replace(body, h("tr", null, h("td", {colspan: COLUMNS.length, class: "empty"},
                                       list.total === 0 && !filters.states.length && !filters.q
                                           ? "No jobs yet: start one with `shoal run JOB.yaml`."
                                           : "No job matches these filters.")));
      return;
    }
    replace(body, ...list.jobs.map((job) =>
        h("tr", {"data-job": job.job_id, class: `row-${job.state}`},
          ...COLUMNS.map((c) => h("td", {class: c.cls}, c.cell(job))))));
  }

  async function load(): Promise<void> {
    const mine = ++generation;
    window.clearTimeout(timer);
    const p = queryOf(filters);
    p.set("page", String(filters.page));
    p.set("per_page", String(filters.perPage));
    p.set("sort", filters.sort);
    try {
      const list = await getJson<JobList>(`/api/jobs?${p}`);
      if (stopped || mine !== generation) return;
      clearError("jobs");
      // A page past the end (jobs were deleted, or a filter narrowed): go to the last one.
      const pages = Math.max(1, Math.ceil(list.total / list.per_page));
      if (filters.page > pages) {
        filters.page = pages;
        changed();
        return;
      }
      // Unchanged (a finished history): leave the page alone, and any text the reader selected.
      const text = JSON.stringify([filters, list]);
      if (text !== lastText) {
        lastText = text;
        renderStates(list.states);
        renderRows(list);
        renderPager(list);
      }
      summary.textContent = `${list.total} job${list.total === 1 ? "" : "s"}`;
    } catch (e) {
      if (stopped || mine !== generation) return;
      reportError("jobs", e);
    }
    if (!stopped && mine === generation) timer = window.setTimeout(() => void load(), REFRESH_MS);
  }

  renderHead();
  void load();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
    window.clearTimeout(debounce);
  };
}
