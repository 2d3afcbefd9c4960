// The page's one WebSocket: subscribe and unsubscribe by alias, each subscription's notifications
// to its handler, and the same subscriptions again after a reconnection (their handlers are told
// with `reset`, as the notification after a reconnection is a complete result again).

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
    entry.spuid = null;
    entry.fresh = true;
    const request = { sparql: entry.sparql, alias };
    if (entry.coalesceMs) request.coalesce_ms = entry.coalesceMs;
    if (this.session.bearer) request.authorization = this.session.bearer;
    this.socket.send(JSON.stringify({ subscribe: request }));
  }

  // coalesceMs: at most one notification per that many ms, with the net change (the gateway's
  // `coalesce_ms`): for views of fast sensors, where every intermediate value costs the browser
  subscribe(sparql, handler, errorHandler = () => {}, coalesceMs = 0) {
    const alias = `dashboard-${++this.counter}`;
    const entry = { sparql, handler, errorHandler, spuid: null, fresh: true, coalesceMs };
    this.byAlias.set(alias, entry);
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.send(alias, entry);
    return alias;
  }

  unsubscribe(alias) {
    const entry = this.byAlias.get(alias);
    this.byAlias.delete(alias);
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
      if (entry) entry.errorHandler(message.error_description || message.error);
    }
  }
}
