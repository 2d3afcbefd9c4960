// The SEPA project's JavaScript client (@arces-wot/sepa-js), unchanged, over the gateway's secure
// gates: register, token, update, query, subscribe, a notification, unsubscribe, a subscription
// ended at the gateway's row limit. One JSON line per
// step on stdout; exit 1 on the first failure. The certificate is trusted through
// NODE_EXTRA_CA_CERTS (set by the test): no verification is turned off.
const { client } = require("@arces-wot/sepa-js");
const SecureSEPA = client.secure;

const [httpsPort, wssPort, identity] = process.argv.slice(2);
const host = "127.0.0.1";
const config = {
  host,
  oauth: { enable: true, register: `https://${host}:${httpsPort}/oauth/register`, tokenRequest: `https://${host}:${httpsPort}/oauth/token` },
  sparql11protocol: { protocol: "https", port: Number(httpsPort), query: { path: "/secure/query", method: "POST", format: "JSON" }, update: { path: "/secure/update", method: "POST", format: "JSON" } },
  sparql11seprotocol: { protocol: "wss", availableProtocols: { ws: { port: 9000, path: "/subscribe" }, wss: { port: Number(wssPort), path: "/secure/subscribe" } } },
};
const say = (step, detail) => console.log(JSON.stringify({ step, ...detail }));
const EX = "http://example.org/js/";

async function main() {
  const registered = await SecureSEPA.register(identity, config);  // its own registration call
  say("registered", { client_id: registered.clientID });
  const sepa = SecureSEPA.defaultClient(registered.clientID, registered.clientSecret, config);
  const updated = await sepa.update(`INSERT DATA { <${EX}lamp> <${EX}on> true }`);
  say("update", { status: updated.status });
  const answer = await sepa.query(`SELECT ?o WHERE { <${EX}lamp> <${EX}on> ?o }`);
  say("query", { values: answer.results.bindings.map((row) => row.o.value) });
  const sub = sepa.subscribe(`SELECT ?o WHERE { <${EX}lamp> <${EX}level> ?o }`, undefined, "level");
  await new Promise((resolve, reject) => {
    sub.on("subscribed", () => { say("subscribed", {}); resolve(); });
    sub.on("error", (error) => reject(new Error(JSON.stringify(error))));
    sub.on("connection-error", (error) => reject(error));
  });
  const added = new Promise((resolve) => sub.on("added", (results) => resolve(results)));
  await sepa.update(`INSERT DATA { <${EX}lamp> <${EX}level> 40 }`);
  const results = await added;
  say("notification", { values: results.results.bindings.map((row) => row.o.value) });
  await new Promise((resolve) => { sub.on("unsubscribed", () => resolve()); sub.unsubscribe(); });
  say("unsubscribed", {});
  // a subscription an update takes past the gateway's max_subscription_rows (5 in the test) ends:
  // the application hears why (a 400 here sent the client's token renewal into a loop instead)
  const big = sepa.subscribe(`SELECT ?n WHERE { <${EX}lamp> <${EX}n> ?n }`, undefined, "big");
  const ended = new Promise((resolve, reject) => {
    big.on("error", (error) => resolve(error));
    big.on("connection-error", (error) => reject(error));
    setTimeout(() => reject(new Error("no error event in 20 s")), 20000);
  });
  await new Promise((resolve) => big.on("subscribed", () => resolve()));
  await sepa.update(`INSERT DATA { <${EX}lamp> <${EX}n> 1, 2, 3, 4, 5, 6, 7 }`);
  const error = await ended;
  say("ended", { error: error.error, status: error.status_code });
}

main().then(() => process.exit(0), (error) => {
  say("failed", { error: String(error && error.response ? `${error.response.status} ${JSON.stringify(error.response.data)}` : error) });
  process.exit(1);
});
