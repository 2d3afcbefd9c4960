// The page's one WebSocket: subscribe and unsubscribe by alias, each subscription's notifications
// to its handler, and the same subscriptions again after a reconnection (their handlers are told
// with `reset`, as the notification after a reconnection is a complete result again).

// A subscription of the page's own (`retry`) that the gateway refused or ended because it was busy
// (503: no query worker free within its time limit, or an evaluation past it) is asked for again,
// after 1 s doubling to 30 s. Why: after 10 s of 1,000 readings/s on a loaded 2-core machine the
// query workers were behind by more than 10 s, the tiles' subscription was refused with "no query
// worker became free within 10 s; retry later", and the tiles stayed empty until a reload. The
// console's subscriptions are not retried (a user's query past the time limit would only be again).
const BUSY = 503;
const RETRY_FIRST_MS = 1000;
const RETRY_MAX_MS = 30000;

export class Subscriptions {
  constructor(session, onState) {
    this.session = session;
    this.onState = onState;
    this.byAlias = new Map(); // alias -> { sparql, handler, spuid }
    this.counter = 0;
    this.socket = null;
    this.retry = 250;
    this.open();
  }

  open() {
    const socket = new WebSocket(this.session.subscribeUrl());
    this.socket = socket;
    socket.onopen = () => {
      this.retry = 250;
      this.onState("live");
      for (const [alias, entry] of this.byAlias) this.send(alias, entry);
    };
    socket.onmessage = (event) => this.receive(JSON.parse(event.data));
    socket.onclose = () => {
      if (this.socket !== socket) return;
      this.onState("reconnecting");
      setTimeout(() => this.open(), this.retry);
      this.retry = Math.min(this.retry * 2, 10000);
    };
  }

  close() {
    const socket = this.socket;
    this.socket = null;
    if (socket) socket.close();
  }

  send(alias, entry) {
    clearTimeout(entry.retryTimer);
    entry.spuid = null;
    entry.fresh = true;
    const request = { sparql: entry.sparql, alias };
    if (entry.coalesceMs) request.coalesce_ms = entry.coalesceMs;
    if (this.session.bearer) request.authorization = this.session.bearer;
    this.socket.send(JSON.stringify({ subscribe: request }));
  }

  // coalesceMs: at most one notification per that many ms, with the net change (the gateway's
  // `coalesce_ms`): for views of fast sensors, where every intermediate value costs the browser.
  // retry: asked for again while the gateway answers it is busy (BUSY); errorHandler is then told
  // null once it is live again.
  subscribe(sparql, handler, errorHandler = () => {}, { coalesceMs = 0, retry = false } = {}) {
    const alias = `dashboard-${++this.counter}`;
    const entry = { sparql, handler, errorHandler, spuid: null, fresh: true, coalesceMs, retry, wait: 0 };
    this.byAlias.set(alias, entry);
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.send(alias, entry);
    return alias;
  }

  unsubscribe(alias) {
    const entry = this.byAlias.get(alias);
    this.byAlias.delete(alias);
    if (entry) clearTimeout(entry.retryTimer);
    if (!entry || !entry.spuid || !this.socket || this.socket.readyState !== WebSocket.OPEN) return;
    const request = { spuid: entry.spuid };
    if (this.session.bearer) request.authorization = this.session.bearer;
    this.socket.send(JSON.stringify({ unsubscribe: request }));
  }

  receive(message) {
    const notification = message.notification;
    if (notification) {
      const entry = this.byAlias.get(notification.alias);
      if (!entry) return;
      entry.spuid = notification.spuid;
      if (entry.wait) {
        entry.wait = 0;
        entry.errorHandler(null);
      }
      const reset = entry.fresh;
      entry.fresh = false;
      entry.handler({
        reset,
        sequence: notification.sequence,
        added: notification.addedResults.results.bindings,
        removed: notification.removedResults.results.bindings,
        vars: notification.addedResults.head.vars,
      });
      return;
    }
    if (message.error || message.status_code) {
      const entry = this.byAlias.get(message.alias);
      if (message.status_code === 401 && this.session.config.secure) this.session.logout();
      if (!entry) return;
      const said = message.error_description || message.error;
      if (!entry.retry || message.status_code !== BUSY) {
        entry.errorHandler(said);
        return;
      }
      entry.wait = Math.min(entry.wait ? entry.wait * 2 : RETRY_FIRST_MS, RETRY_MAX_MS);
      entry.errorHandler(`${said} (asking again in ${entry.wait / 1000} s)`);
      entry.retryTimer = setTimeout(() => this.again(message.alias, entry), entry.wait);
    }
  }

  // a subscription the gateway was too busy for, asked for again if it is still wanted
  again(alias, entry) {
    if (this.byAlias.get(alias) === entry && this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.send(alias, entry);
    }
  }
}
