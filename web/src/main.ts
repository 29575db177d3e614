// The dashboard's entry point: a client-side router on location.pathname
// (docs/design/0014-web-ui.md). Each page renders into #app and returns a function that stops
// its timers and streams when the user leaves it.
import {clearAllErrors} from "./api";
import {h, replace} from "./dom";
import {jobPage} from "./job";
import {jobsPage} from "./jobs";
import {modelsPage} from "./models";
import {navigate, setRouter} from "./router";

export type Cleanup = () => void;

let leave: Cleanup | null = null;

function route(): void {
  if (leave) {
    leave();
    leave = null;
  }
  clearAllErrors();
  const app = document.getElementById("app");
  if (!app) return;
  replace(app);
  const path = window.location.pathname;
  for (const a of document.querySelectorAll<HTMLAnchorElement>("header nav a")) {
    const target = a.getAttribute("href") || "";
    const current = target === "/" ? path === "/" || path.startsWith("/jobs") : path.startsWith(target);
    a.classList.toggle("current", current);
  }
  const job = /^\/jobs\/([^/]+)\/?$/.exec(path);
  if (path === "/" || path === "/jobs" || path === "/jobs/") {
    document.title = "Shoal: jobs";
    leave = jobsPage(app);
  } else if (job) {
    const id = decodeURIComponent(job[1]);
    document.title = `Shoal: ${id}`;
    leave = jobPage(app, id);
  } else if (path === "/models" || path === "/models/") {
    document.title = "Shoal: models";
    leave = modelsPage(app);
  } else {
    document.title = "Shoal: not found";
    replace(app, h("p", null, `No page ${path}. `), h("a", {href: "/", "data-route": true}, "All jobs"));
  }
}

document.addEventListener("click", (event) => {
  if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey ||
      event.shiftKey || event.altKey) {
    return;
  }
  const a = (event.target as Element | null)?.closest?.("a");
  if (!a || a.target || a.hasAttribute("download")) return;
  const href = a.getAttribute("href");
  // Only the app's own pages; /login and other servers load normally.
  if (!href || !href.startsWith("/") || href.startsWith("//") || href.startsWith("/login")) return;
  event.preventDefault();
  navigate(href);
});
window.addEventListener("popstate", route);
setRouter(route);
route();
