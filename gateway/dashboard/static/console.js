// The SPARQL console: a query's table, an update's counts, and subscriptions whose rows stay live:
// each notification's added rows are shown added (and join the table), its removed rows are shown
// removed (and leave it), so one sees what changed and not only what is.

import { schedule } from "./frames.js";
import { consoleWorker } from "./session.js";
import { termText } from "./terms.js";

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

// A console subscription's reconnection: after 250 ms, doubling to 10 s (as the page's own socket)
const RETRY_FIRST_MS = 250;
const RETRY_MAX_MS = 10000;
let aliases = 0;

// A subscription's WebSocket, rows and change log live in a worker (console-worker.js), which sends
// only what is drawn. Why: the first notification of a 90,000-row subscription is ~12 MB of JSON,
// and receiving and parsing it here held the page's main thread 436-1,428 ms in one task.
class ConsoleSubscription {
  constructor(session, sparql, onStop) {
    this.session = session;
    this.sparql = sparql;
    this.onStop = onStop;
    this.view = { vars: [], rows: [], total: 0, log: [], last: null };
    this.error = null;
    this.lost = false;
    this.retry = RETRY_FIRST_MS;
    this.element = document.createElement("div");
    this.element.className = "console-subscription";
    this.render = () => this.draw();
    this.worker = consoleWorker();
    this.worker.onmessage = ({ data }) => this.receive(data);
    this.worker.onerror = (event) => this.fail(event.message || "the subscription's worker failed");
    const alias = `console-${++aliases}`;
    this.worker.postMessage({ subscribe: { sparql, alias, shown: SHOWN_ROWS, logRows: LOG_ROWS } });
    this.open();
  }

  open() {
    this.worker.postMessage({ open: { url: this.session.subscribeUrl(), authorization: this.session.bearer } });
  }

  receive({ view, closed, status, error }) {
    if (view) {
      this.view = view;
      this.lost = false;
      this.retry = RETRY_FIRST_MS;
    } else if (closed) {
      this.lost = true;
      this.reopening = setTimeout(() => this.open(), this.retry);
      this.retry = Math.min(this.retry * 2, RETRY_MAX_MS);
    } else {
      if (status === 401 && this.session.config.secure) this.session.logout();
      if (error) this.error = error;
    }
    schedule(this.render);
  }

  fail(error) {
    this.error = error;
    schedule(this.render);
  }

  draw() {
    const { vars, rows, total, log, last } = this.view;
    const head = document.createElement("div");
    head.className = "subscription-head";
    const text = Object.assign(document.createElement("code"), { textContent: this.sparql });
    const stop = Object.assign(document.createElement("button"), { type: "button", textContent: "Unsubscribe" });
    stop.addEventListener("click", () => this.stop());
    head.append(text, stop);
    const parts = [head];
    if (this.error) parts.push(Object.assign(document.createElement("p"), { className: "error", textContent: this.error }));
    if (this.lost) parts.push(Object.assign(document.createElement("p"), { className: "error", textContent: "connection lost: reconnecting" }));
    parts.push(Object.assign(document.createElement("h4"), { textContent: `Current rows (${total})` }));
    parts.push(table(vars, rows.map((row) => [row, ""]), "current", total));
    parts.push(Object.assign(document.createElement("h4"), { textContent: "Changes, newest first" }));
    if (last && !last.reset) {
      const said = `notification ${last.sequence}: ${last.added} added, ${last.removed} removed`;
      parts.push(Object.assign(document.createElement("p"), { className: "notification-counts", textContent: said }));
    }
    parts.push(table(vars, log, "changes"));
    this.element.replaceChildren(...parts);
  }

  // unsubscribed and closed by the worker, which then ends
  stop() {
    clearTimeout(this.reopening);
    this.worker.postMessage({ stop: { authorization: this.session.bearer } });
    this.element.remove();
    this.onStop(this);
  }
}

export class SparqlConsole {
  // `rights`: a client that may write no graph gets no Update button (the gateway would answer 403)
  constructor(session, elements, rights) {
    this.session = session;
    this.elements = elements;
    this.live = new Set(); // the ConsoleSubscriptions shown
    this.running = null; // the AbortController of the query being run
    this.turn = 0; // the last query or update run: only its reply is drawn
    addEventListener("pagehide", () => this.close());
    elements.update.hidden = elements.delay.hidden = rights.write.length === 0;
    elements.query.addEventListener("click", () => this.run(() => this.query()));
    elements.update.addEventListener("click", () => this.run(() => this.update()));
    elements.subscribe.addEventListener("click", () => this.run(async () => this.subscribe()));
  }

  get text() { return this.elements.sparql.value; }

  // `action`'s error is shown unless a later query or update was run meanwhile (it starts a turn
  // before its first await)
  async run(action) {
    this.elements.error.textContent = "";
    const running = action();
    const turn = this.turn;
    try {
      await running;
    } catch (error) {
      if (turn === this.turn && error.name !== "AbortError") this.elements.error.textContent = error.message;
    }
  }

  // A query or update run ends the query before it, if it still runs, and only the last one run
  // draws its reply. Why: each query ran to its end in a worker of its own and drew its result when
  // it came, so a slow query's table replaced that of the query run after it (shown under the other
  // query's text), and a query that never ended kept its request open.
  async query() {
    const turn = this.next();
    const running = this.running = new AbortController();
    const reply = await this.session.query(this.text, SHOWN_ROWS, running.signal);
    if (turn !== this.turn) return;
    this.running = null;
    const result = this.elements.result;
    if (reply && reply.head && "boolean" in reply) {
      result.replaceChildren(Object.assign(document.createElement("p"), { textContent: String(reply.boolean) }));
    } else if (reply && reply.results) {
      result.replaceChildren(table(reply.head.vars, reply.results.bindings.map((row) => [row, ""]), "", reply.count));
    } else {
      result.replaceChildren(Object.assign(document.createElement("pre"), { textContent: String(reply) }));
    }
  }

  next() {
    this.running?.abort();
    this.running = null;
    return ++this.turn;
  }

  async update() {
    const turn = this.next();
    const reply = await this.session.update(this.text, this.elements.delay.value.trim());
    if (turn !== this.turn) return;
    const text = reply.scheduled
      ? `scheduled ${reply.scheduled.id}, due ${reply.scheduled.due}`
      : `added ${reply.added}, removed ${reply.removed}, notifications ${reply.notifications}`;
    this.elements.result.replaceChildren(Object.assign(document.createElement("p"), { className: "update-result", textContent: text }));
  }

  subscribe() {
    const subscription = new ConsoleSubscription(this.session, this.text, (stopped) => this.live.delete(stopped));
    this.live.add(subscription);
    this.elements.subscriptions.prepend(subscription.element);
  }

  // every subscription ended: at logout, and when the page goes
  close() {
    for (const subscription of [...this.live]) subscription.stop();
  }
}
