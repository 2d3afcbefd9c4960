// Live tiles, one per sensor and property, from ONE subscription to the latest view.
//
// The query is a UNION of single triple patterns, one per thing a tile shows, not a join and not
// OPTIONALs: the engine keeps a UNION incremental, and a branch of one pattern costs it no lookup
// (a changed quad is the solution), so the page's subscription costs the gateway about half what a
// joined row per node did (measured: +0.37 against +0.77 CPU-s over 5 s of 100 readings/s). Since
// the subscription is coalesced (below), the gateway re-evaluates it once per 250 ms instead of
// processing it at each reading (broker/core/spu_manager.py, SpuManager._defer). A
// reading changes the node's time row and, unless the value repeats, its value row; the sensor,
// property and unit rows do not change (a quad deleted and re-inserted by one update is in neither
// set). A time row is therefore a reading.
//
// Stale: no reading for N periods (config stale_periods), where a sensor's period is learned from
// the result times of its readings (median of the last 8 intervals); until two readings came, the
// period is DEFAULT_PERIOD_S. Time is the gateway's: result times are its clock, and our estimate of
// its clock is the Date of config.json, then the latest result times seen arriving (a reading cannot
// arrive before it was stored; the best of the last 10-20 s, Session.noteOffset, so that a step of
// either clock is followed), so a browser whose clock is off does not mark everything stale.

import { schedule } from "./frames.js";
import { formatValue, shortName, unitSymbol } from "./terms.js";

const GW = "http://w3id.org/sepa-gateway/ns#";
const DEFAULT_PERIOD_S = 60;
const MIN_STALE_MS = 1000;
const INTERVALS = 8;
// the tiles' notifications, at most one per 250 ms with the net change (the gateway's coalesce_ms):
// at 1,000 readings/s receiving every one was most of the page's CPU (4.5-4.8 CPU-s per 20 s in
// `bench dashboard`, 2.9-3.6 coalesced); a reading after a quiet 250 ms still shows at once. A
// sensor faster than 4 Hz then shows (and charts live) its latest value per 250 ms, and its period
// for staleness is learned as 250 ms (a tile is stale after 1 s at least, MIN_STALE_MS)
const TILES_COALESCE_MS = 250;

export function latestQuery(graph) {
  return `PREFIX gw: <${GW}>
SELECT ?node ?value ?time ?sensor ?property ?unit WHERE { GRAPH <${graph}> {
  { ?node gw:value ?value } UNION { ?node gw:resultTime ?time } UNION { ?node gw:sensor ?sensor }
  UNION { ?node gw:property ?property } UNION { ?node gw:unit ?unit } } }`;
}

class Tile {
  constructor(node) {
    this.node = node;
    this.sensor = "";
    this.property = "";
    this.value = null;
    this.time = 0;
    this.unit = "";
    this.intervals = [];
    this.stale = false;
    this.element = null;
    this.key = ""; // sensor and property: the tiles' order
  }

  period() {
    if (this.intervals.length === 0) return DEFAULT_PERIOD_S * 1000;
    const sorted = [...this.intervals].sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length / 2)];
  }

  observe(time) {
    if (this.time && time > this.time) {
      this.intervals.push(time - this.time);
      if (this.intervals.length > INTERVALS) this.intervals.shift();
    }
    this.time = Math.max(this.time, time);
  }
}

export class Tiles {
  // elements: `tiles` (the container), `counter`, `error` (why the view stopped, when it did)
  constructor(session, subscriptions, elements, periods) {
    this.session = session;
    this.container = elements.tiles;
    this.counter = elements.counter;
    this.error = elements.error;
    this.periods = periods;
    this.tiles = new Map(); // node IRI -> Tile
    this.placed = []; // the tiles in the container, in their order
    this.unplaced = []; // tiles whose element was made since the last frame, not in the container yet
    this.changed = new Set();
    this.listeners = [];
    this.select = null; // what a click on a tile does (the chart sets it)
    this.counted = -1;
    this.render = () => this.draw();
    // An error ends the subscription (past [websocket] max_subscription_rows, about 25,000 values):
    // said in the panel, or the tiles froze at their last values with nothing to tell why
    subscriptions.subscribe(latestQuery(session.config.graphs.latest), (n) => this.apply(n), (error) => {
      this.error.textContent = error ? `The sensors are no longer updated: ${error}` : "";
    }, { coalesceMs: TILES_COALESCE_MS, retry: true });
    setInterval(() => this.markStale(), 1000);
  }

  onReading(listener) { this.listeners.push(listener); }

  tile(node) {
    let tile = this.tiles.get(node);
    if (!tile) {
      tile = new Tile(node);
      this.tiles.set(node, tile);
    }
    return tile;
  }

  apply({ reset, added, removed }) {
    if (reset) {
      this.error.textContent = "";
      for (const tile of this.tiles.values()) tile.element?.remove();
      this.tiles.clear();
    }
    const kept = new Set(added.filter((row) => row.sensor).map((row) => row.node.value));
    for (const row of removed) {
      const node = row.node.value;
      if (row.sensor && !kept.has(node) && this.tiles.has(node)) {
        this.tiles.get(node).element?.remove(); // the node left the view
        this.tiles.delete(node);
      }
    }
    const times = new Map(); // node -> result time of its reading in this notification
    for (const row of added) { // what a node is, and its value, before its reading is told
      const node = row.node.value;
      if (row.time) { // not a reading if not a time: its NaN became the clock estimate (NaN wins
        // every Math.max), and no tile was marked stale until a reading came 10-20 s later
        const time = Date.parse(row.time.value);
        if (Number.isFinite(time)) times.set(node, time);
        continue;
      }
      const tile = this.tile(node);
      if (row.sensor) tile.sensor = row.sensor.value;
      else if (row.property) tile.property = row.property.value;
      else if (row.unit) tile.unit = unitSymbol(row.unit.value);
      else if (row.value) tile.value = row.value;
      this.changed.add(tile);
    }
    const now = Date.now();
    for (const [node, time] of times) {
      const tile = this.tile(node);
      tile.observe(time);
      tile.stale = false; // a reading just came; the next check judges it again
      if (!reset) this.session.noteOffset(time - now);
      if (tile.value !== null) for (const listener of this.listeners) listener(tile, time, tile.value);
      this.changed.add(tile);
    }
    schedule(this.render);
  }

  markStale() {
    const now = this.session.gatewayNow();
    for (const tile of this.tiles.values()) {
      const stale = tile.time > 0 && now - tile.time > Math.max(this.periods * tile.period(), MIN_STALE_MS);
      if (stale !== tile.stale) {
        tile.stale = stale;
        this.changed.add(tile);
      }
    }
    if (this.changed.size) schedule(this.render);
  }

  draw() {
    const changed = [...this.changed];
    this.changed.clear(); // first: a tile that failed to draw is not tried again at every frame
    for (const tile of changed) {
      if (!this.tiles.has(tile.node) || !tile.sensor || !tile.property || tile.value === null) continue;
      try {
        this.drawTile(tile);
      } catch (error) { // one tile's data must not stop the others from being drawn
        console.warn("tile not drawn", tile.node, error);
      }
    }
    this.place();
    if (this.counted !== this.tiles.size) {
      this.counted = this.tiles.size;
      const sensors = new Set([...this.tiles.values()].map((tile) => tile.sensor));
      this.counter.textContent = `${sensors.size} sensors, ${this.tiles.size} values`;
    }
  }

  drawTile(tile) {
    if (!tile.element) this.create(tile);
    const [sensor, property, value, unit] = tile.element.children;
    sensor.textContent = shortName(tile.sensor);
    property.textContent = shortName(tile.property);
    value.textContent = formatValue(tile.value);
    unit.textContent = tile.unit;
    tile.element.classList.toggle("stale", tile.stale);
  }

  create(tile) {
    const element = document.createElement("button");
    element.type = "button";
    element.className = "tile";
    element.dataset.sensor = tile.sensor;
    element.dataset.property = tile.property;
    for (const part of ["sensor", "property", "value", "unit"]) {
      const span = document.createElement("span");
      span.className = part;
      element.append(span);
    }
    element.addEventListener("click", () => this.select?.(tile.sensor));
    element.addEventListener("pointerenter", () => { // written when looked at, not at every reading
      element.title = `${tile.sensor}\n${tile.property}\n${new Date(tile.time).toISOString()}` +
        (tile.stale ? `\nstale: no reading for ${this.periods} periods` : "");
    });
    // in sensor and property order, so that a tile stays where one saw it
    tile.key = `${tile.sensor}\u0001${tile.property}`;
    tile.element = element;
    this.unplaced.push(tile);
  }

  // The new tiles of this frame into their places, by one merge with the placed ones (kept in
  // order in `placed`: each goes before its successor's element). Why not a bisection of the
  // container's children per new tile: an index into `children` after an insertion walks the
  // list again: 20,000 sensors arriving in one notification (a publisher allowed a templated topic
  // makes that many) held the main thread 17 s in one task; now 2.8 s, most of it laying out the
  // grid (tiles off the screen are skipped: content-visibility in style.css). Measured in Chromium,
  // 20,000 insertions alone took 18.1 s by index into `children`, 0.56 s with the successor known.
  place() {
    if (this.unplaced.length === 0) return;
    const added = this.unplaced.filter((tile) => this.tiles.get(tile.node) === tile) // not removed meanwhile
      .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const placed = this.placed.filter((tile) => tile.element.isConnected); // removed meanwhile
    const merged = [];
    let next = 0;
    for (const tile of added) {
      while (next < placed.length && placed[next].key <= tile.key) merged.push(placed[next++]);
      this.container.insertBefore(tile.element, placed[next]?.element || null);
      merged.push(tile);
    }
    while (next < placed.length) merged.push(placed[next++]);
    this.placed = merged;
    this.unplaced = [];
  }

  // Tiles of one sensor: its properties and their units (for the chart).
  ofSensor(sensor) {
    return [...this.tiles.values()].filter((tile) => tile.sensor === sensor);
  }
}
