// The dashboard's entry: load the configuration, log in on the HTTPS port, then start the parts
// over one WebSocket. Each part is a module of its own (docs/dashboard.md lists them).

import { Actuators } from "./actuators.js";
import { Chart } from "./chart.js";
import { SparqlConsole } from "./console.js";
import { Mappings } from "./mappings.js";
import { Metrics } from "./metrics.js";
import { Scheduled } from "./scheduled.js";
import { Session } from "./session.js";
import { Subscriptions } from "./socket.js";
import { Tiles } from "./tiles.js";

const $ = (id) => document.getElementById(id);

async function reachable() {
  try {
    return (await fetch("/dashboard/config.json", { cache: "no-store" })).ok;
  } catch {
    return false;
  }
}

function showLogin(session) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("status").textContent = "logged out";
  $("login").onsubmit = async (event) => {
    event.preventDefault();
    $("login-error").textContent = "";
    try {
      await session.login($("client-id").value.trim(), $("client-secret").value);
      $("client-secret").value = "";
      start(session); // not a reload: the secret, kept in memory to renew the token, would be lost
    } catch (error) {
      $("login-error").textContent = `Login refused: ${error.message}`;
    }
  };
}

async function start(session) {
  $("login").hidden = true;
  $("main").hidden = false;
  let rights;
  try {
    rights = await session.rights();
  } catch (error) {
    if (error.status === 401) return showLogin(session);
    rights = { identity: null, read: [], write: [] };
  }
  $("who").textContent = session.config.secure ? `client ${rights.identity}` : "local (plain port)";
  $("logout").hidden = !session.config.secure;
  $("logout").onclick = () => session.logout();
  const subscriptions = new Subscriptions(session, (state) => {
    $("status").textContent = state;
    $("status").className = `status ${state}`;
  });
  const sparqlConsole = new SparqlConsole(session, {
    sparql: $("sparql"), query: $("run-query"), update: $("run-update"), subscribe: $("run-subscribe"), delay: $("update-delay"),
    error: $("console-error"), result: $("console-result"), subscriptions: $("console-subscriptions"),
  }, rights);
  session.onLogout = async () => {
    subscriptions.close();
    sparqlConsole.close();
    $("main").hidden = true; // nothing the last client could see stays shown
    $("status").textContent = "logged out";
    // a clean start, once the gateway answers: a reload while it is unreachable (the token expired
    // during an outage) would leave the browser on its error page for good
    for (let wait = 1000; !(await reachable()); wait = Math.min(wait * 2, 30000)) {
      $("status").textContent = "logged out (gateway unreachable, waiting)";
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
    location.reload();
  };
  const tiles = new Tiles(session, subscriptions, {
    tiles: $("tiles"), counter: $("sensor-count"), error: $("sensors-error"),
  }, session.config.stale_periods);
  new Chart(session, tiles, $("chart-panel"), $("chart-title"), $("chart"));
  new Actuators(session, subscriptions, $("actuators-panel"), $("actuators"), $("actuators-error"), rights);
  new Scheduled(session, $("scheduled-panel"), $("scheduled"), $("scheduled-refresh"));
  new Mappings(session, subscriptions, {
    mappings: $("mappings"), coap: $("coap-observations"), mappingForm: $("mapping-form"),
    coapForm: $("coap-form"), error: $("mappings-error"),
  }, rights);
  new Metrics(session, {
    stats: $("stats"), chart: $("metrics-chart"), error: $("metrics-error"), health: $("health"), panel: $("gateway-panel"),
    spus: $("spus"), spusSummary: $("spus-summary"),
  }, rights);
}

const session = await Session.load();
if (session.needsLogin) showLogin(session); else start(session);
