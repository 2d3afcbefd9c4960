// The SPARQL console: a query's table, an update's counts, and subscriptions whose rows stay live:
// each notification's added rows are shown added (and join the table), its removed rows are shown
// removed (and leave it), so one sees what changed and not only what is.

import { schedule } from "./frames.js";
import { rowKey, termText } from "./terms.js";

const LOG_ROWS = 50;
// Rows a table draws; the rest are counted, not drawn. Why: a subscription may hold 100,000 rows,
// and drawing 30,000 of them took the page 13 s, again at every notification.
export const SHOWN_ROWS = 500;

// A results table of at most SHOWN_ROWS of `rows` ([row, class] pairs, any iterable), and a line
// saying how many were left out (of `total`, when `rows` holds only the first ones).
function table(vars, rows, className = "", total = 0) {
  const element = document.createElement("table");
  element.className = `results ${className}`;
  const head = element.createTHead().insertRow();
  for (const name of vars) head.append(Object.assign(document.createElement("th"), { textContent: `?${name}` }));
  const body = element.createTBody();
  let count = 0;
  for (const [row, rowClass] of rows) {
    if (++count > SHOWN_ROWS) continue;
    const line = body.insertRow();
    if (rowClass) line.className = rowClass;
    for (const name of vars) line.insertCell().textContent = termText(row[name]);
  }
  count = Math.max(count, total);
  if (count <= SHOWN_ROWS) return element;
  const note = Object.assign(document.createElement("p"), {
    className: "rows-left-out", textContent: `${count} rows: the first ${SHOWN_ROWS} are shown`,
  });
  const wrapper = document.createElement("div");
  wrapper.append(element, note);
  return wrapper;
}

function* current(rows) {
  for (const [row] of rows.values()) yield [row, ""];
}

class ConsoleSubscription {
  constructor(owner, sparql) {
    this.owner = owner;
    this.sparql = sparql;
    this.vars = [];
    this.rows = new Map(); // row key -> [row, count]
    this.log = []; // [row, "row-added" | "row-removed"], newest first
    this.element = document.createElement("div");
    this.element.className = "console-subscription";
    this.render = () => this.draw();
    this.alias = owner.subscriptions.subscribe(sparql, (n) => this.apply(n), (error) => {
      this.error = error;
      schedule(this.render);
    });
  }

  apply({ reset, added, removed, vars }) {
    this.vars = vars;
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
      // newest first: the added rows, last first, then the removed ones. Only the LOG_ROWS kept are
      // copied: one unshift a row moved the whole log each time, and a 90,000-row notification froze
      // the page for 3.7 s
      const added_ = added.slice(-LOG_ROWS).reverse().map((row) => [row, "row-added"]);
      const removed_ = removed.slice(-LOG_ROWS).reverse().map((row) => [row, "row-removed"]);
      this.log = added_.concat(removed_, this.log).slice(0, LOG_ROWS);
    }
    schedule(this.render);
  }

  draw() {
    const head = document.createElement("div");
    head.className = "subscription-head";
    const text = Object.assign(document.createElement("code"), { textContent: this.sparql });
    const stop = Object.assign(document.createElement("button"), { type: "button", textContent: "Unsubscribe" });
    stop.addEventListener("click", () => this.stop());
    head.append(text, stop);
    const parts = [head];
    if (this.error) parts.push(Object.assign(document.createElement("p"), { className: "error", textContent: this.error }));
    parts.push(Object.assign(document.createElement("h4"), { textContent: `Current rows (${this.rows.size})` }));
    parts.push(table(this.vars, current(this.rows), "current"));
    parts.push(Object.assign(document.createElement("h4"), { textContent: "Changes, newest first" }));
    parts.push(table(this.vars, this.log, "changes"));
    this.element.replaceChildren(...parts);
  }

  stop() {
    this.owner.subscriptions.unsubscribe(this.alias);
    this.element.remove();
  }
}

export class SparqlConsole {
  // `rights`: a client that may write no graph gets no Update button (the gateway would answer 403)
  constructor(session, subscriptions, elements, rights) {
    this.session = session;
    this.subscriptions = subscriptions;
    this.elements = elements;
    elements.update.hidden = elements.delay.hidden = rights.write.length === 0;
    elements.query.addEventListener("click", () => this.run(() => this.query()));
    elements.update.addEventListener("click", () => this.run(() => this.update()));
    elements.subscribe.addEventListener("click", () => this.run(async () => this.subscribe()));
  }

  get text() { return this.elements.sparql.value; }

  async run(action) {
    this.elements.error.textContent = "";
    try { await action(); } catch (error) { this.elements.error.textContent = error.message; }
  }

  async query() {
    const reply = await this.session.query(this.text, SHOWN_ROWS);
    const result = this.elements.result;
    if (reply && reply.head && "boolean" in reply) {
      result.replaceChildren(Object.assign(document.createElement("p"), { textContent: String(reply.boolean) }));
    } else if (reply && reply.results) {
      result.replaceChildren(table(reply.head.vars, reply.results.bindings.map((row) => [row, ""]), "", reply.count));
    } else {
      result.replaceChildren(Object.assign(document.createElement("pre"), { textContent: String(reply) }));
    }
  }

  async update() {
    const reply = await this.session.update(this.text, this.elements.delay.value.trim());
    const text = reply.scheduled
      ? `scheduled ${reply.scheduled.id}, due ${reply.scheduled.due}`
      : `added ${reply.added}, removed ${reply.removed}, notifications ${reply.notifications}`;
    this.elements.result.replaceChildren(Object.assign(document.createElement("p"), { className: "update-result", textContent: text }));
  }

  subscribe() {
    const subscription = new ConsoleSubscription(this, this.text);
    this.elements.subscriptions.prepend(subscription.element);
  }
}
