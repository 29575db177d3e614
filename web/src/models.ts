// The models page (`/models`): for each `shoal serve` given to `shoal ui --serve URL`, its
// readiness and, per model, the versions and their state, requests/s, latency percentiles,
// the mean batch size and errors (GET /api/models, from the servers' own endpoints).
import {clearError, getJson, ModelsReply, reportError} from "./api";
import {fmtNumber, h, replace, stateBadge} from "./dom";

const REFRESH_MS = 5000;

export function modelsPage(app: HTMLElement): () => void {
  let stopped = false;
  let timer: number | undefined;
  const body = h("div", {class: "models"}, h("p", {class: "muted"}, "Loading…"));
  replace(app, h("h1", null, "Models"), body);

  function render(reply: ModelsReply): void {
    if (reply.servers.length === 0) {
      replace(body, h("p", {class: "muted"},
                      "No model servers: start the dashboard with `shoal ui --serve http://HOST:PORT` " +
                      "(one --serve per shoal serve)."));
      return;
    }
    replace(body, ...reply.servers.map((server) =>
        h("section", {class: "server", "data-server": server.url},
          h("h2", null, server.url, " ", stateBadge(server.ready ? "ready" : "not-ready")),
          server.error ? h("p", {class: "server-error"}, server.error) : null,
          server.models.length === 0 ? h("p", {class: "muted"}, "No models.") :
          h("table", {class: "grid models-table"},
            h("thead", null, h("tr", null,
              ...["Model", "Versions", "Requests/s", "p50 ms", "p90 ms", "p99 ms", "Mean batch", "Errors"].map(
                  (c, i) => h("th", {class: i >= 2 ? "num" : null}, c)))),
            h("tbody", null, ...server.models.map((m) =>
                h("tr", {"data-model": m.name},
                  h("td", {class: "mono"}, m.name),
                  h("td", null, ...m.versions.map((v) =>
                      h("span", {class: "version", title: v.reason || ""}, `v${v.version} `, stateBadge(v.state.toLowerCase())))),
                  h("td", {class: "num"}, m.requests_per_second === null ? "—" : fmtNumber(m.requests_per_second, 1)),
                  h("td", {class: "num"}, fmtNumber(m.latency_ms.p50, 1)),
                  h("td", {class: "num"}, fmtNumber(m.latency_ms.p90, 1)),
                  h("td", {class: "num"}, fmtNumber(m.latency_ms.p99, 1)),
                  h("td", {class: "num"}, m.mean_batch_size === null ? "—" : fmtNumber(m.mean_batch_size, 2)),
                  h("td", {class: "num"}, String(m.errors ?? 0)))))))));
  }

  async function load(): Promise<void> {
    try {
      const reply = await getJson<ModelsReply>("/api/models");
      if (stopped) return;
      clearError("models");
      render(reply);
    } catch (e) {
      if (stopped) return;
      reportError("models", e);
    }
    if (!stopped) timer = window.setTimeout(() => void load(), REFRESH_MS);
  }

  void load();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}
