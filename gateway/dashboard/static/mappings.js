// MQTT and CoAP mappings (the Topics Manager): the gw:TopicMapping nodes of the mappings graph and
// the CoAP resources the gateway observes, viewed live (one subscription each) and added with an
// INSERT (a mapping only if its id is new) the adapters take up at once (gateway/observations/rdf.py is the shape).

import { schedule } from "./frames.js";
import { mayWrite } from "./session.js";
import { iri, literal, rowKey } from "./terms.js";

const GW = "http://w3id.org/sepa-gateway/ns#";
const MAPPING_PREFIX = "urn:sepa-gateway:mapping:";
const FIELDS = { path: "jsonPath", sensor: "sensorTemplate", property: "propertyTemplate", unit: "unit" };

// One table row per ?node, from an incremental subscription: a UNION whose first branch binds what
// every listed node has (`required`) and whose other branches bind one optional field each. Why not
// OPTIONAL: an OPTIONAL subscription is re-evaluated, and a network client's re-evaluated
// subscriptions start the gateway's re-evaluation worker, a process replaying every delta of the
// store (observations included) for as long as the page is open; measured with `bench dashboard`
// (1,000 MQTT readings/s): 2.6-3.5 CPU-s of the gateway's processes more per 20 s with the page
// open, against -0.1-0.5 with no re-evaluated subscription (3 runs each).
function live(subscriptions, sparql, container, columns, required) {
  const rows = new Map();
  const render = () => {
    const nodes = new Map();
    for (const row of rows.values()) {
      const node = nodes.get(row.node.value) || {};
      for (const [name, term] of Object.entries(row)) if (term && !(name in node)) node[name] = term;
      nodes.set(row.node.value, node);
    }
    const listed = [...nodes.values()].filter((node) => node[required]);
    const table = document.createElement("table");
    table.className = "results";
    const head = table.createTHead().insertRow();
    for (const [, title] of columns) head.append(Object.assign(document.createElement("th"), { textContent: title }));
    const body = table.createTBody();
    const order = (node) => columns.map(([name]) => (node[name] ? node[name].value : "")).join("\u0001");
    for (const node of listed.sort((a, b) => order(a).localeCompare(order(b)))) { // as the table reads
      const line = body.insertRow();
      for (const [name] of columns) line.insertCell().textContent = node[name] ? node[name].value : "";
    }
    container.replaceChildren(table);
  };
  subscriptions.subscribe(sparql, ({ reset, added, removed, vars }) => {
    if (reset) rows.clear();
    for (const row of removed) rows.delete(rowKey(row, vars));
    for (const row of added) rows.set(rowKey(row, vars), row);
    schedule(render);
  }, (error) => { if (error) container.textContent = error; }, { retry: true });
}

export class Mappings {
  // `rights`: the forms are shown only to a client that may write the mappings graph
  constructor(session, subscriptions, elements, rights) {
    this.session = session;
    this.elements = elements;
    this.graph = session.config.graphs.mappings;
    elements.mappingForm.hidden = elements.coapForm.hidden = !mayWrite(rights, this.graph);
    // an update's counts cover only graphs the client may read: only then does "added": 0 say something
    this.readable = rights.read.includes("*") || rights.read.includes(this.graph);
    const graph = iri(this.graph);
    const mapping = "?node a gw:TopicMapping";
    live(subscriptions, `PREFIX gw: <${GW}> SELECT ?node ?id ?topic ?extract ?sensor ?property ?unit WHERE { GRAPH ${graph} {
      { ${mapping} ; gw:mappingId ?id ; gw:topicFilter ?topic ; gw:extract ?extract }
      UNION { ${mapping} ; gw:sensorTemplate ?sensor } UNION { ${mapping} ; gw:propertyTemplate ?property }
      UNION { ${mapping} ; gw:unit ?unit } } }`, elements.mappings, [
      ["id", "id"], ["topic", "filter"], ["extract", "extract"], ["sensor", "sensor"], ["property", "property"], ["unit", "unit"],
    ], "id");
    live(subscriptions, `PREFIX gw: <${GW}> SELECT ?node ?uri ?source WHERE { GRAPH ${graph} {
      { ?node a gw:CoapObservation ; gw:uri ?uri } UNION { ?node a gw:CoapObservation ; gw:source ?source } } }`,
    elements.coap, [["uri", "observed CoAP resource"], ["source", "source"]], "uri");
    elements.mappingForm.addEventListener("submit", (event) => { event.preventDefault(); this.addMapping(); });
    elements.coapForm.addEventListener("submit", (event) => { event.preventDefault(); this.addObservation(); });
  }

  // true: done (the form is emptied); false: `refused(reply)` said nothing was done (the form is
  // kept); undefined: failed, the error shown
  async run(sparql, form, refused = () => false) {
    this.elements.error.textContent = "";
    try {
      const reply = await this.session.update(sparql);
      if (refused(reply)) return false;
      form.reset();
      return true;
    } catch (error) {
      this.elements.error.textContent = error.message;
      return undefined;
    }
  }

  // Added only if no mapping has its node or its id: a second INSERT of one id gave the node two
  // gw:topicFilter values (and more), the MQTT adapter then dropped the mapping (logged only) and the
  // readings on its topic stopped being stored. The check and the insert are one update.
  async addMapping() {
    const form = this.elements.mappingForm;
    const values = Object.fromEntries(new FormData(form));
    const node = iri(MAPPING_PREFIX + encodeURIComponent(values.id));
    const triples = [
      `${node} a <${GW}TopicMapping>`,
      `${node} <${GW}mappingId> ${literal(values.id)}`,
      `${node} <${GW}topicFilter> ${literal(values.topic)}`,
      `${node} <${GW}extract> ${literal(values.extract)}`,
    ];
    for (const [field, predicate] of Object.entries(FIELDS)) {
      if (values[field]) triples.push(`${node} <${GW}${predicate}> ${literal(values[field])}`);
    }
    const graph = iri(this.graph);
    const taken = `{ ${node} ?p ?o } UNION { ?other <${GW}mappingId> ${literal(values.id)} }`;
    const reply = await this.run(
      `INSERT { GRAPH ${graph} { ${triples.join(" . ")} } } WHERE { FILTER NOT EXISTS { GRAPH ${graph} { ${taken} } } }`,
      form,
      (result) => this.readable && result && result.added === 0,
    );
    if (reply === false) {
      this.elements.error.textContent =
        `A mapping with id "${values.id}" exists already; it is kept as it is. Choose another id.`;
    }
  }

  addObservation() {
    const form = this.elements.coapForm;
    const values = Object.fromEntries(new FormData(form));
    const node = iri(`urn:sepa-gateway:coap-observation:${encodeURIComponent(values.uri)}`);
    const triples = [`${node} a <${GW}CoapObservation>`, `${node} <${GW}uri> ${literal(values.uri)}`];
    if (values.source) triples.push(`${node} <${GW}source> ${literal(values.source)}`);
    this.run(`INSERT DATA { GRAPH ${iri(this.graph)} { ${triples.join(" . ")} } }`, form);
  }
}
