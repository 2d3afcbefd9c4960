// The SEPA project's JavaScript client (@arces-wot/sepa-js), unchanged, as a JSAP-driven application
// over the gateway's plain gates: a JSAP written as the client's readme writes one (namespaces,
// forcedBindings of type uri, prefixed or not, and literal, string or number; a query entry with its
// own sparql11seprotocol), its generated producer and consumer functions, several subscriptions on
// one socket (SELECT, ASK, one with a syntax error), array bindings (a VALUES block), an HTTP query
// error, unsubscribe (tests/broker/gates/test_sepa_js_apps.py).
// One JSON line per step on stdout; exit 1 on the first failure.
const { Jsap } = require("@arces-wot/sepa-js");

const [httpPort, wsPort] = process.argv.slice(2).map(Number);
const say = (step, detail) => console.log(JSON.stringify({ step, ...detail }));
const values = (results) => results.results.bindings.map((row) => Object.fromEntries(Object.entries(row).map(([k, v]) => [k, v.value])));
const next = (emitter, event) => new Promise((resolve) => emitter.once(event, resolve));
const gates = {
  host: "127.0.0.1",
  sparql11protocol: { protocol: "http", port: httpPort, query: { path: "/query", method: "POST", format: "JSON" }, update: { path: "/update", method: "POST", format: "JSON" } },
  sparql11seprotocol: { protocol: "ws", availableProtocols: { ws: { port: wsPort, path: "/subscribe" }, wss: { port: 9443, path: "/secure/subscribe" } } },
};
const jsap = {
  ...gates,
  namespaces: { ex: "http://example.org/app#", xsd: "http://www.w3.org/2001/XMLSchema#" },
  extended: { room: "lab" },
  updates: {
    SET: { sparql: "INSERT DATA { ?lamp ex:level ?level . ?lamp ex:name ?name }", forcedBindings: { lamp: { type: "uri", value: "ex:lamp1" }, level: { type: "literal", value: 0 }, name: { type: "literal", value: "none" } } },
  },
  queries: {
    LEVELS: { sparql: "SELECT ?lamp ?level WHERE { ?lamp ex:level ?level }" },
    LEVEL: { sparql: "SELECT ?level WHERE { ?lamp ex:level ?level }", forcedBindings: { lamp: { type: "uri", value: "ex:lamp1" } } },
    HIGH: { sparql: "ASK { ?lamp ex:level ?level FILTER(?level > 50) }" },
    BROKEN: { sparql: "SELECT ?level WHERE { ?lamp ex:level ?level " },
    NAMES: { sparql: "SELECT ?name WHERE { ?lamp ex:name ?name }", forcedBindings: { lamp: { type: "uri", value: "" } },
      // a query entry's own subscribe gate: the /subscribe the HTTP port serves too
      sparql11seprotocol: { protocol: "ws", availableProtocols: { ws: { port: httpPort, path: "/subscribe" } } } },
  },
};

async function application() {
  const app = new Jsap(jsap);
  say("updated", await app.SET({ lamp: "ex:lamp1", level: 10, name: "desk" }));
  say("updated", await app.SET({ lamp: "http://example.org/app#lamp2", level: 70, name: "shelf" }));
  say("query", { rows: values(await app.LEVELS.query({})) });
  // several subscriptions of one application share one socket
  const subscriptions = { LEVELS: app.LEVELS({}), LEVEL: app.LEVEL({}), HIGH: app.HIGH({}), BROKEN: app.BROKEN({}) };
  const first = await Promise.all(Object.entries(subscriptions).map(([key, sub]) => new Promise((resolve) => {
    sub.on("subscribed", (n) => resolve([key, n.addedResults.boolean !== undefined ? n.addedResults.boolean : values(n.addedResults)]));
    sub.on("error", (e) => resolve([key, { error: e.error, status: e.status_code }]));
  })));
  say("first", Object.fromEntries(first));
  say("sockets", { count: app.api.connectionPool.size });
  const added = next(subscriptions.LEVEL, "added");
  const removed = next(subscriptions.LEVEL, "removed");
  await app.api.update("PREFIX ex: <http://example.org/app#> DELETE DATA { ex:lamp1 ex:level 10 } ; INSERT DATA { ex:lamp1 ex:level 55 }");
  say("notified", { added: values(await added), removed: values(await removed) });
  const names = app.NAMES({ lamp: "ex:lamp2" });
  say("forced", { rows: values((await next(names, "subscribed")).addedResults) });
  // array bindings: the client writes a VALUES block into the query
  say("values", { rows: values(await app.LEVEL.query({ lamp: ["ex:lamp1", "ex:lamp2"] })) });
  try {
    await app.api.query("SELECT * WHERE { ?s ");
    say("query-error", { status: null });
  } catch (error) {
    say("query-error", { status: error.response.status, error: error.response.data.error });
  }
  for (const sub of [...Object.values(subscriptions).filter((s) => s !== subscriptions.BROKEN), names]) {
    await new Promise((resolve) => { sub.once("unsubscribed", resolve); sub.unsubscribe(); });
  }
  say("unsubscribed", {});
}

// a step that never comes fails the run instead of hanging it
setTimeout(() => { say("failed", { error: "timed out" }); process.exit(1); }, 60000);
application().then(() => process.exit(0), (error) => {
  say("failed", { error: String(error && error.response ? `${error.response.status} ${JSON.stringify(error.response.data)}` : error && error.stack) });
  process.exit(1);
});
