// The gateway as the page sees it: where things are (config.json), who we are (the OAuth token on
// the HTTPS port), and the HTTP calls. Why sessionStorage for the token: it dies with the tab and
// is never shared with other tabs or written to disk like localStorage; the client secret is kept
// only in memory, to renew the token while the page is open. Neither is ever logged.

const SCHEDULED_PAGE = 200; // rows a page of delayed updates shows: a phone renders them at once
const TOKEN_KEY = "sepa-dashboard-token";
// setTimeout takes at most 2^31-1 ms (~24.8 days): a longer delay fires at once, and a renewal
// armed so looped on /oauth/token; a longer wait is made of timers of this length
const MAX_TIMER_MS = 2 ** 31 - 1;
const RETRY_FIRST_MS = 1000; // a renewal the gateway did not answer is tried again after this,
const RETRY_MAX_MS = 30000; // doubling up to this, while the token still lives
// the clock estimate keeps the best (highest) offset seen over the last one or two windows of
// this length (by the page's monotonic clock): a step of either clock is taken within two windows;
// the highest of all time kept a gateway stepped back (or a browser stepped forward) an hour ahead
// of itself for good, every tile marked stale again one second after each reading
const OFFSET_WINDOW_MS = 10000;

export class HttpError extends Error {
  constructor(status, document) {
    super((document && (document.error_description || document.error)) || `HTTP ${status}`);
    this.status = status;
  }
}

export class Session {
  constructor(config, clockOffsetMs) {
    this.config = config;
    this.clockOffsetMs = clockOffsetMs; // gateway clock minus ours, refined by the tiles
    this.offsetWindow = { start: performance.now(), best: clockOffsetMs, before: clockOffsetMs };
    this.credentials = null;
    this.renewal = null;
    this.expiry = null;
    this.onLogout = () => {};
    const kept = JSON.parse(sessionStorage.getItem(TOKEN_KEY) || "null");
    this.token = kept && kept.expires > Date.now() + 5000 ? kept : null;
    if (this.token) this.expireAt(this.token.expires); // nothing renews a kept token: no secret
  }

  static async load() {
    const reply = await fetch("/dashboard/config.json", { cache: "no-cache" });
    const config = await reply.json();
    const date = Date.parse(reply.headers.get("Date") || "");
    return new Session(config, Number.isNaN(date) ? 0 : date + 500 - Date.now());
  }

  get needsLogin() { return this.config.secure && !this.token; }

  async login(clientId, clientSecret) {
    const reply = await fetch(this.config.token, {
      method: "POST",
      headers: { Authorization: "Basic " + btoa(`${clientId}:${clientSecret}`) },
    });
    const document = await reply.json().catch(() => null);
    if (reply.status !== 201 && reply.status !== 200) throw new HttpError(reply.status, document);
    this.credentials = { clientId, clientSecret };
    this.keep(document.access_token, document.expires_in);
  }

  keep(accessToken, expiresIn) {
    this.token = { value: accessToken, expires: Date.now() + expiresIn * 1000 };
    sessionStorage.setItem(TOKEN_KEY, JSON.stringify(this.token));
    clearTimeout(this.renewal);
    if (this.credentials) this.renewAt(Date.now() + expiresIn * 800, RETRY_FIRST_MS); // at 80 % of its life
  }

  // Renew the token at `when` (ms since the epoch).
  renewAt(when, retryMs) {
    clearTimeout(this.renewal);
    at(when, () => this.renew(retryMs), (timer) => { this.renewal = timer; });
  }

  // Log out when a token kept from before a reload expires. Why: the reload dropped the secret, so
  // nothing renews it, and the gateway does not end a subscription at its token's expiry: the page
  // stayed live, showing every new reading, for as long as the tab was open (an operator's screen
  // left logged in for good). A token the page renews is logged out by renew() when it must be.
  expireAt(when) {
    clearTimeout(this.expiry);
    at(when, () => this.logout(), (timer) => { this.expiry = timer; });
  }

  // A renewal the gateway refuses (400, 401: the client was reset or revoked) logs out. One it does
  // not answer (down, restarting: the fetch fails, or 5xx) is tried again with backoff while the
  // token lives, the page left as it is: logging out reloads the page, and a reload while the
  // gateway is unreachable left the browser on its error page for good.
  async renew(retryMs) {
    if (!this.credentials) return;
    try {
      await this.login(this.credentials.clientId, this.credentials.clientSecret);
    } catch (error) {
      if (!this.credentials) return; // logged out meanwhile
      const left = this.token ? this.token.expires - Date.now() : 0;
      if ((error instanceof HttpError && (error.status === 400 || error.status === 401)) || left <= 0) {
        this.logout();
        return;
      }
      this.renewAt(Date.now() + Math.min(retryMs, left), Math.min(retryMs * 2, RETRY_MAX_MS));
    }
  }

  // The token is revoked at the gateway too (RFC 7009), not only forgotten here: a copy of it (a
  // shared machine, a proxy's log) was good until it expired. Sent with keepalive: the page reloads.
  logout() {
    clearTimeout(this.renewal);
    clearTimeout(this.expiry);
    if (this.token && this.config.revoke) {
      fetch(this.config.revoke, { method: "POST", headers: { Authorization: this.bearer }, keepalive: true })
        .catch(() => {});
    }
    this.token = null;
    this.credentials = null;
    sessionStorage.removeItem(TOKEN_KEY);
    this.onLogout();
  }

  get bearer() { return this.token ? `Bearer ${this.token.value}` : null; }

  headers(extra = {}) {
    return this.bearer ? { ...extra, Authorization: this.bearer } : extra;
  }

  async call(url, options = {}) {
    const reply = await fetch(url, { ...options, headers: this.headers(options.headers || {}) });
    if (reply.status === 401 && this.config.secure) this.logout();
    const text = await reply.text();
    let document = null;
    try { document = text ? JSON.parse(text) : null; } catch { document = text; }
    if (!reply.ok) throw new HttpError(reply.status, document);
    return document;
  }

  // A query's reply, fetched and parsed in a worker (console-worker.js): a SELECT's bindings cut to
  // the first `shown`, with `count` the rows there were. SELECT and ASK as SPARQL JSON; CONSTRUCT
  // and DESCRIBE as Turtle (shown as text). `signal` aborting ends the worker, its request with it,
  // and rejects with an AbortError.
  query(sparql, shown, signal = null) {
    const init = {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/sparql-query", Accept: "application/sparql-results+json, text/turtle;q=0.9" }),
      body: sparql,
    };
    const worker = consoleWorker();
    return new Promise((resolve, reject) => {
      worker.onmessage = ({ data }) => {
        worker.terminate();
        if (data.failed) return reject(new Error(data.failed));
        if (data.status === 401 && this.config.secure) this.logout();
        if (!data.ok) return reject(new HttpError(data.status, data.document));
        resolve(data.document);
      };
      worker.onerror = (event) => { worker.terminate(); reject(new Error(event.message || "query worker failed")); };
      signal?.addEventListener("abort", () => { worker.terminate(); reject(signal.reason); });
      worker.postMessage({ query: { url: new URL(this.config.query, location.href).href, init, shown } });
    });
  }

  // `delay` (ISO 8601 duration or milliseconds) schedules it: the reply is {"scheduled": {id, due}}
  update(sparql, delay = "") {
    const url = delay ? `${this.config.update}?delay=${encodeURIComponent(delay)}` : this.config.update;
    return this.call(url, {
      method: "POST", headers: { "Content-Type": "application/sparql-update" }, body: sparql,
    });
  }

  // one page of this client's delayed updates; the reply's `next`, sent back as `after`, is the next page
  scheduled(after = null) {
    const query = new URLSearchParams({ limit: String(SCHEDULED_PAGE) });
    if (after) query.set("after", after);
    return this.call(`${this.config.scheduled}?${query}`);
  }

  cancel(id) { return this.call(`${this.config.scheduled}/${encodeURIComponent(id)}`, { method: "DELETE" }); }

  async metrics() {
    const reply = await fetch(this.config.metrics, { headers: this.headers() });
    if (!reply.ok) throw new HttpError(reply.status, await reply.json().catch(() => null));
    return reply.text();
  }

  // What this client may write, as the server says now: "*" or graph IRIs (plain port: everything).
  async rights() {
    if (!this.config.rights) return { identity: null, read: ["*"], write: ["*"] };
    return this.call(this.config.rights);
  }

  subscribeUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${this.config.subscribe}`;
  }

  gatewayNow() { return Date.now() + this.clockOffsetMs; }

  // `offsetMs`: the gateway's time of something that just arrived minus ours now, a lower bound of
  // the offset (it was stamped before it arrived)
  noteOffset(offsetMs) {
    const window = this.offsetWindow;
    const now = performance.now();
    if (now - window.start > OFFSET_WINDOW_MS) {
      window.before = now - window.start > 2 * OFFSET_WINDOW_MS ? offsetMs : window.best;
      window.best = offsetMs;
      window.start = now;
    }
    window.best = Math.max(window.best, offsetMs);
    this.clockOffsetMs = Math.max(window.best, window.before);
  }
}

// `action` at `when` (ms since the epoch), through timers no longer than setTimeout holds; `keep`
// is given each timer, to clear it
function at(when, action, keep) {
  const wait = when - Date.now();
  keep(wait > MAX_TIMER_MS ? setTimeout(() => at(when, action, keep), MAX_TIMER_MS) : setTimeout(action, Math.max(0, wait)));
}

// A worker for the console's large replies: a query's, or a subscription's (console-worker.js)
export function consoleWorker() {
  return new Worker("/dashboard/console-worker.js", { type: "module" });
}

export function mayWrite(rights, graph) {
  return rights.write.includes("*") || rights.write.includes(graph);
}
