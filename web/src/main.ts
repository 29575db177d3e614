// The dashboard's entry point; routing is on location.pathname (docs/design/0014-web-ui.md).
const app = document.getElementById("app");
if (app) app.textContent = "Shoal";
