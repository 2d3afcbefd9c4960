// The zoomable history chart of the selected sensor: one series per numeric property.
//
// History comes from the observations graph once, when a sensor is chosen (the last HISTORY_S,
// at most HISTORY_ROWS readings); after that the chart grows from the tiles' subscription (each
// notification's value: at most one per 250 ms, tiles.js TILES_COALESCE_MS, so a faster sensor is
// charted live at 4 points a second, and whole again when chosen again), so it costs no
// subscription of its own. Drag to zoom; while zoomed the
// chart keeps the zoom, a double-click follows the live end again.

import { schedule } from "./frames.js";
import { iri, shortName } from "./terms.js";

const HISTORY_S = 600;
const HISTORY_ROWS = 5000;
const MAX_POINTS = 3000;
// redrawing the whole canvas is the page's costliest render: twice a second follows a sensor well
const CHART_GAP_MS = 500;

function historyQuery(graph, sensor, since) {
  return `PREFIX sosa: <http://www.w3.org/ns/sosa/>
PREFIX qudt: <http://qudt.org/schema/qudt/>
PREFIX xsd: <http://www.w3.org/2001/XMLSchema#>
SELECT ?property ?time ?value WHERE { GRAPH <${graph}> {
  ?o sosa:madeBySensor ${iri(sensor)} ; sosa:observedProperty ?property ; sosa:resultTime ?time ;
     sosa:hasResult ?r . ?r qudt:numericValue ?value }
  FILTER(?time > "${since}"^^xsd:dateTime) } ORDER BY ?time LIMIT ${HISTORY_ROWS}`;
}

export class Chart {
  constructor(session, tiles, panel, title, container) {
    this.session = session;
    this.tiles = tiles;
    this.panel = panel;
    this.title = title;
    this.container = container;
    this.sensor = null;
    this.plot = null;
    this.properties = [];
    this.data = [[]];
    this.zoomed = false;
    this.render = () => this.draw();
    tiles.select = (sensor) => this.show(sensor);
    tiles.onReading((tile, time, value) => this.reading(tile, time, value));
    // the container's width changes with the window and with a scrollbar coming or going
    new ResizeObserver(() => this.resize()).observe(container);
  }

  async show(sensor) {
    this.sensor = sensor;
    this.panel.hidden = false;
    this.title.textContent = shortName(sensor);
    this.properties = [];
    this.data = [[]];
    this.zoomed = false;
    this.plot?.destroy();
    this.plot = null;
    const since = new Date(this.session.gatewayNow() - HISTORY_S * 1000).toISOString();
    const history = [];
    try {
      const reply = await this.session.query(historyQuery(this.session.config.graphs.observations, sensor, since));
      for (const row of reply.results.bindings) {
        history.push([row.property.value, Date.parse(row.time.value), Number(row.value.value)]);
      }
    } catch (error) {
      this.title.textContent = `${shortName(sensor)} (history unavailable: ${error.message})`;
    }
    if (this.sensor !== sensor) return;
    for (const [property, time, value] of history) this.add(property, time, value);
    schedule(this.render);
  }

  reading(tile, time, term) {
    if (tile.sensor !== this.sensor) return;
    const value = Number(term.value);
    if (!Number.isFinite(value) || term.datatype?.endsWith("#boolean")) return;
    this.add(tile.property, time, value);
    schedule(this.render, CHART_GAP_MS);
  }

  add(property, time, value) {
    let index = this.properties.indexOf(property);
    if (index < 0) {
      this.properties.push(property);
      this.data.push(this.data[0].map(() => null));
      index = this.properties.length - 1;
      this.plot?.destroy();
      this.plot = null; // a new series: built again on the next frame
    }
    const x = time / 1000;
    const xs = this.data[0];
    if (xs.length && x < xs[xs.length - 1]) return; // the history query and the live rows overlap
    xs.push(x);
    this.data.forEach((series, position) => { if (position > 0) series.push(position === index + 1 ? value : null); });
    if (xs.length > MAX_POINTS) for (const series of this.data) series.shift();
  }

  options() {
    const colors = ["#2a7ab0", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#16a085"];
    return {
      width: this.container.clientWidth || 320,
      height: 240,
      cursor: { drag: { x: true, y: false } },
      // one reading has no span of its own: a minute either side of it (uPlot's own default is years)
      scales: { x: { time: true, range: (plot, min, max) => (min === max ? [min - 60, max + 60] : [min, max]) } },
      series: [{}, ...this.properties.map((property, index) => ({
        label: shortName(property) + (this.unitOf(property) ? ` (${this.unitOf(property)})` : ""),
        stroke: colors[index % colors.length],
        spanGaps: true, // uPlot shows the points themselves while they are few enough to tell apart
      }))],
      hooks: {
        setSelect: [(plot) => { if (plot.select.width > 0) this.zoomed = true; }],
        ready: [(plot) => plot.over.addEventListener("dblclick", () => { this.zoomed = false; })],
      },
    };
  }

  unitOf(property) {
    return this.tiles.ofSensor(this.sensor).find((tile) => tile.property === property)?.unit || "";
  }

  draw() {
    if (!this.sensor || !window.uPlot || this.properties.length === 0) return;
    if (!this.plot) {
      this.container.replaceChildren();
      this.plot = new window.uPlot(this.options(), this.data, this.container);
    } else {
      this.plot.setData(this.data, !this.zoomed);
    }
    // what is drawn, for people reading the page's source and for the browser tests
    const xs = this.data[0];
    this.container.dataset.sensor = this.sensor;
    this.container.dataset.points = String(xs.length);
    const last = this.data.slice(1).map((series) => series[series.length - 1]).find((value) => value !== null);
    this.container.dataset.last = last === undefined ? "" : String(last);
  }

  resize() {
    const width = this.container.clientWidth || 320;
    if (this.plot && this.plot.width !== width) this.plot.setSize({ width, height: 240 });
  }
}
