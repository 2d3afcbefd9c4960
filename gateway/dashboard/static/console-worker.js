// The SPARQL console's large replies, received and parsed off the page's main thread (a module
// worker); only what the console draws goes back to the page. Why: a 90,000-row SELECT is ~12 MB
// of SPARQL JSON, and parsing it on the main thread held the page 663 ms in one task (and 234 ms in
// another), with every tile and the chart frozen meanwhile (Chromium, load average 16); the first
// notification of a 90,000-row subscription is as large, and held it 436-1,428 ms.
//
// {query: {url, init, shown}}: one query's reply, a SELECT's bindings cut to the first `shown`
// with `count` the rows there were; the page then ends the worker.
// {subscribe: {sparql, alias, shown, logRows}} then {open: {url, authorization}}: one console
// subscription on a WebSocket of its own, its current rows and its change log kept here; the page
// gets a `view` (the first `shown` rows, their total, the last `logRows` changes, the counts of the
// last notification) at most every MIN_GAP_MS, `error` frames, and `closed` when the socket ends
// (it sends `open` again to reconnect). {stop: {authorization}} unsubscribes, closes and ends.

import { MIN_GAP_MS } from "./frames.js";
import { rowKey } from "./terms.js";

let feed = null;

self.onmessage = ({ data }) => {
  if (data.query) query(data.query);
  else if (data.subscribe) feed = new Feed(data.subscribe);
  else if (data.open) feed.open(data.open);
  else if (data.stop) feed.stop(data.stop);
};

async function query({ url, init, shown }) {
  try {
    const reply = await fetch(url, init);
    const text = await reply.text();
    let document = null;
    try { document = text ? JSON.parse(text) : null; } catch { document = text; }
    const bindings = document && document.results && document.results.bindings;
    if (Array.isArray(bindings)) {
      document.count = bindings.length;
      document.results.bindings = bindings.slice(0, shown);
    }
    self.postMessage({ status: reply.status, ok: reply.ok, document });
  } catch (error) {
    self.postMessage({ failed: String(error && error.message || error) });
  }
}

class Feed {
  constructor({ sparql, alias, shown, logRows }) {
    Object.assign(this, { sparql, alias, shown, logRows });
    this.vars = [];
    this.rows = new Map(); // row key -> [row, count]
    this.log = []; // [row, "row-added" | "row-removed"], newest first
    this.last = null; // the last notification: {sequence, added, removed} (counts)
    this.socket = null;
    this.spuid = null;
    this.posting = null;
    this.dirty = false;
  }

  open({ url, authorization }) {
    const socket = new WebSocket(url);
    this.socket = socket;
    this.spuid = null;
    this.fresh = true; // the first notification on a socket is a complete result
    socket.onopen = () => {
      const request = { sparql: this.sparql, alias: this.alias };
      if (authorization) request.authorization = authorization;
      socket.send(JSON.stringify({ subscribe: request }));
    };
    socket.onmessage = (event) => this.receive(JSON.parse(event.data));
    socket.onclose = () => {
      if (this.socket !== socket) return;
      this.socket = null;
      self.postMessage({ closed: true });
    };
  }

  receive(message) {
    const notification = message.notification;
    if (notification) {
      if (notification.alias !== this.alias) return;
      this.spuid = notification.spuid;
      this.apply(notification);
      return;
    }
    if (message.error || message.status_code) {
      const ours = message.alias === this.alias;
      self.postMessage({ status: message.status_code, error: ours ? message.error_description || message.error : null });
    }
  }

  apply(notification) {
    const added = notification.addedResults.results.bindings;
    const removed = notification.removedResults.results.bindings;
    const vars = this.vars = notification.addedResults.head.vars;
    const reset = this.fresh;
    this.fresh = false;
    if (reset) this.rows.clear();
    for (const row of removed) {
      const key = rowKey(row, vars);
      const entry = this.rows.get(key);
      if (entry && --entry[1] === 0) this.rows.delete(key);
    }
    for (const row of added) {
      const key = rowKey(row, vars);
      const entry = this.rows.get(key);
      if (entry) entry[1] += 1; else this.rows.set(key, [row, 1]);
    }
    if (!reset) {
      // newest first: the added rows, last first, then the removed ones. Only the rows kept are
      // copied: one unshift a row moved the whole log each time, and a 90,000-row notification froze
      // the page for 3.7 s
      const added_ = added.slice(-this.logRows).reverse().map((row) => [row, "row-added"]);
      const removed_ = removed.slice(-this.logRows).reverse().map((row) => [row, "row-removed"]);
      this.log = added_.concat(removed_, this.log).slice(0, this.logRows);
    }
    this.last = { sequence: notification.sequence, added: added.length, removed: removed.length, reset };
    this.dirty = true;
    if (!this.posting) this.posting = setTimeout(() => this.post(), 0);
  }

  // The view, at most every MIN_GAP_MS (the page draws no more often): a fast subscription's every
  // notification would otherwise copy its drawn rows to the page
  post() {
    this.posting = null;
    if (!this.dirty) return;
    this.dirty = false;
    const rows = [];
    for (const [row] of this.rows.values()) {
      if (rows.length === this.shown) break;
      rows.push(row);
    }
    self.postMessage({ view: { vars: this.vars, rows, total: this.rows.size, log: this.log, last: this.last } });
    this.posting = setTimeout(() => this.post(), MIN_GAP_MS);
  }

  stop({ authorization }) {
    const socket = this.socket;
    this.socket = null;
    if (socket && socket.readyState === WebSocket.OPEN && this.spuid) {
      const request = { spuid: this.spuid };
      if (authorization) request.authorization = authorization;
      socket.send(JSON.stringify({ unsubscribe: request }));
    }
    if (socket) socket.close();
    self.close();
  }
}
