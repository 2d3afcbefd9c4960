// Gateway figures from /metrics (Prometheus text; on the HTTPS port /secure/metrics, for a client
// that may read every graph): subscriptions and SPU statistics, the shipper's backlog and upload
// health, the adapters, and rates over time (kept in the page, POLL_MS apart, for HISTORY points).
// While the panel is open, each poll also asks for the SPU table (/spus, /secure/spus on the HTTPS
// port, same right): the SPUS_SHOWN SPUs with the most subscriptions, their queries and figures.
// /health (the plain port's only: config.health is null on the HTTPS port) is shown when the
// gateway has it; nothing depends on it. It is asked for only when the panel is first opened.

import { schedule } from "./frames.js";

const POLL_MS = 2000;
const HISTORY = 900;
const SPUS_SHOWN = 50;
const SPU_COLUMNS = [["kind", "Kind"], ["subscriptions", "Subscriptions"], ["notifications", "Notifications"],
  ["solutions", "Solutions"], ["owners", "Held by"], ["query", "Query"]];
const GROUPS = [
  ["Gateway", /^sepa_(build_info.*|uptime_seconds)$/],
  ["Subscriptions and SPUs", /^sepa_(subscriptions|subscriptions_max|subscriptions_ended_total|notifications_total|updates_total|update_processing_seconds_(min|avg|max)|lutt_hits_total|ws_connections|ws_subscription_clients|ws_subscription_bytes|stage_seconds_total.*)$/],
  ["Scheduler and delayed updates", /^sepa_(scheduler_.*|delayed_pending|delayed_.*_total|query_workers.*)$/],
  ["Shipper", /^sepa_shipper_.*/],
  ["MQTT", /^sepa_mqtt_(readings|mapping_errors|duplicates_skipped|connection_connected|ingest_bad_input|connection_session_takeovers)$/],
  ["CoAP", /^sepa_coap_[a-z_]+$/],
  ["Retention and store", /^sepa_(retention|store)_[a-z_]+$/],
];
const RATES = [["updates/s", "sepa_updates_total"], ["notifications/s", "sepa_notifications_total"],
  ["MQTT readings/s", "sepa_mqtt_readings"], ["CoAP readings/s", "sepa_coap_readings"]];

export function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const cut = line.lastIndexOf(" ");
    samples.set(line.slice(0, cut), Number(line.slice(cut + 1)));
  }
  return samples;
}

export class Metrics {
  constructor(session, elements, rights) {
    this.session = session;
    this.elements = elements;
    this.samples = new Map();
    this.spus = null;
    this.previous = null;
    this.series = [[], ...RATES.map(() => [])];
    this.plot = null;
    this.render = () => this.draw();
    if (!rights.read.includes("*")) { // the gateway would refuse (403) every poll
      elements.error.textContent = "The gateway's figures are shown to clients that may read every graph.";
      return;
    }
    this.poll();
    this.timer = setInterval(() => this.poll(), POLL_MS);
    const panel = elements.panel;
    const once = () => {
      if (!panel.open) return;
      panel.removeEventListener("toggle", once);
      this.health();
      schedule(this.render);
    };
    panel.addEventListener("toggle", once);
    panel.addEventListener("toggle", () => this.refreshSpus());
    new ResizeObserver(() => {
      const width = elements.chart.clientWidth;
      if (this.plot && width && this.plot.width !== width) this.plot.setSize({ width, height: 200 });
    }).observe(elements.chart);
  }

  async poll() {
    let text;
    try {
      text = await this.session.metrics();
    } catch (error) {
      this.elements.error.textContent = `metrics: ${error.message}`;
      if (error.status === 403 || error.status === 401) clearInterval(this.timer);
      return;
    }
    this.elements.error.textContent = "";
    const now = Date.now() / 1000;
    const samples = parseMetrics(text);
    if (this.previous) {
      const [then, before] = this.previous;
      this.series[0].push(now);
      RATES.forEach(([, name], index) => {
        const rate = samples.has(name) && before.has(name) ? (samples.get(name) - before.get(name)) / (now - then) : null;
        this.series[index + 1].push(rate);
      });
      if (this.series[0].length > HISTORY) for (const values of this.series) values.shift();
    }
    this.previous = [now, samples];
    this.samples = samples;
    schedule(this.render);
    await this.refreshSpus();
  }

  async refreshSpus() {
    if (!this.elements.panel.open || !this.session.config.spus) return;
    try {
      this.spus = await this.session.call(`${this.session.config.spus}?limit=${SPUS_SHOWN}`);
    } catch (error) {
      this.elements.error.textContent = `SPUs: ${error.message}`;
      return;
    }
    schedule(this.render);
  }

  drawSpus() {
    const table = this.spus;
    if (!table) return;
    const shown = table.shown;
    this.elements.spusSummary.textContent = `${table.spus} SPUs, ${table.subscriptions} subscriptions`
      + (shown.length < table.spus ? ` (the ${shown.length} with the most subscriptions shown)` : "");
    const head = document.createElement("tr");
    for (const [, title] of SPU_COLUMNS) head.append(Object.assign(document.createElement("th"), { textContent: title }));
    const rows = shown.map((spu) => {
      const row = document.createElement("tr");
      for (const [key] of SPU_COLUMNS) {
        const value = spu[key];
        const cell = document.createElement("td");
        const text = Array.isArray(value) ? value.join(", ") : value === null ? "" : String(value);
        cell.textContent = key === "query" ? text.replace(/\s+/g, " ") : text;
        if (key === "query") cell.title = value;
        row.append(cell);
      }
      return row;
    });
    this.elements.spus.replaceChildren(head, ...rows);
  }

  async health() {
    if (!this.session.config.health) return;
    try {
      const reply = await fetch(this.session.config.health, { headers: this.session.headers() });
      if (reply.ok) this.elements.health.textContent = JSON.stringify(await reply.json(), null, 2);
    } catch { /* a gateway without /health: nothing to show */ }
  }

  draw() {
    const groups = [];
    for (const [title, pattern] of GROUPS) {
      const entries = [...this.samples].filter(([name]) => pattern.test(name));
      if (entries.length === 0) continue;
      const group = document.createElement("div");
      group.className = "stat-group";
      group.append(Object.assign(document.createElement("h3"), { textContent: title }));
      const list = document.createElement("dl");
      for (const [name, value] of entries) {
        list.append(Object.assign(document.createElement("dt"), { textContent: name.replace(/^sepa_/, "") }));
        const shown = Number.isInteger(value) ? String(value) : value.toPrecision(4);
        list.append(Object.assign(document.createElement("dd"), { textContent: shown, title: name }));
      }
      group.append(list);
      groups.push(group);
    }
    this.elements.stats.replaceChildren(...groups);
    this.drawSpus();
    if (!window.uPlot || this.series[0].length < 2 || !this.elements.panel.open) return;
    if (!this.plot) {
      const colors = ["#2a7ab0", "#c0392b", "#27ae60", "#8e44ad"];
      this.plot = new window.uPlot({
        width: this.elements.chart.clientWidth || 320,
        height: 200,
        scales: { x: { time: true } },
        series: [{}, ...RATES.map(([label], index) => ({ label, stroke: colors[index], spanGaps: true }))],
      }, this.series, this.elements.chart);
    } else {
      this.plot.setData(this.series);
    }
  }
}
