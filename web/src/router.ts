// Navigation between the app's pages without reloading (main.ts installs the router).
let onRoute: () => void = () => {};

export function setRouter(route: () => void): void {
  onRoute = route;
}

export function navigate(href: string): void {
  if (href !== window.location.pathname + window.location.search) {
    window.history.pushState(null, "", href);
  }
  onRoute();
}

// Rewrites the current URL's query (reload keeps a page's filters) without a new history entry.
export function setQuery(params: URLSearchParams): void {
  const query = params.toString();
  const href = window.location.pathname + (query ? `?${query}` : "");
  if (href !== window.location.pathname + window.location.search) {
    window.history.replaceState(null, "", href);
  }
}
