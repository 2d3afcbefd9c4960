// The SEPA project's JavaScript client (@arces-wot/sepa-js), unchanged, across a restart of the
// gateway (tests/broker/gates/test_sepa_js_restart.py): SOCKETS clients (one socket each), with
// PER_SOCKET subscriptions each, all to one subject; the test stops or kills the gateway, starts it
// again on the same ports, and updates. One JSON line per event on stdout; the process runs until
// the test ends it, or until the client itself throws (then Node prints the error and exits 1).
// Only listeners are added to the client's objects, to watch: the close code of its socket, and
// its connection's own "connection-lost" and "reconnected" events.
const { SEPA, client } = require("@arces-wot/sepa-js");

const [mode, port, wsPort, sockets, perSocket, host = "127.0.0.1"] = process.argv.slice(2);
const say = (step, detail) => console.log(JSON.stringify({ step, ...detail }));
const plain = {
  host,
  sparql11protocol: { protocol: "http", port: Number(port), query: { path: "/query", method: "POST", format: "JSON" }, update: { path: "/update", method: "POST", format: "JSON" } },
  sparql11seprotocol: { protocol: "ws", availableProtocols: { ws: { port: Number(wsPort), path: "/subscribe" } } },
};
const secure = {
  host,
  oauth: { enable: true, register: `https://${host}:${port}/oauth/register`, tokenRequest: `https://${host}:${port}/oauth/token` },
  sparql11protocol: { protocol: "https", port: Number(port), query: { path: "/secure/query", method: "POST", format: "JSON" }, update: { path: "/secure/update", method: "POST", format: "JSON" } },
  sparql11seprotocol: { protocol: "wss", availableProtocols: { wss: { port: Number(wsPort), path: "/secure/subscribe" } } },
};

async function clients() {
  if (mode === "plain") {
    return Array.from({ length: Number(sockets) }, () => new SEPA(plain));
  }
  const registered = await client.secure.register("js-app", secure);
  return Promise.all(Array.from({ length: Number(sockets) }, async () => {
    const sepa = client.secure.defaultClient(registered.clientID, registered.clientSecret, secure);
    await sepa.login();
    return sepa;
  }));
}

async function main() {
  (await clients()).forEach((sepa, socket) => {
    for (let i = 0; i < Number(perSocket); i++) {
      const sub = sepa.subscribe("SELECT ?o WHERE { <http://example.org/js/lamp> <http://example.org/js/level> ?o }", undefined, `s${socket}-${i}`);
      sub.on("subscribed", () => say("subscribed", { socket, i }));
      sub.on("added", (results) => say("added", { socket, i, values: results.results.bindings.map((row) => row.o.value) }));
      sub.on("error", (error) => say("error", { socket, i, error }));
      sub.on("connection-error", (error) => say("connection-error", { socket, i, error: String(error) }));
    }
    const connection = [...sepa.connectionPool.values()][0];
    connection.ws.addEventListener("close", (event) => say("closed", { socket, code: event.code }));
    connection.on("connection-lost", () => say("connection-lost", { socket }));
    connection.on("reconnected", () => say("reconnected", { socket }));
  });
}

setInterval(() => {}, 1000);
main().catch((error) => { say("failed", { error: String(error) }); process.exit(1); });
