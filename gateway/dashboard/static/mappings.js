// MQTT and CoAP mappings (the Topics Manager): the gw:TopicMapping nodes of the mappings graph and
// the CoAP resources the gateway observes, viewed live (one subscription each) and added with an
// INSERT DATA the adapters take up at once (gateway/observations/rdf.py is the shape).

import { schedule } from "./frames.js";
import { iri, literal, rowKey } from "./terms.js";

const GW = "http://w3id.org/sepa-gateway/ns#";
const MAPPING_PREFIX = "urn:sepa-gateway:mapping:";
const FIELDS = { path: "jsonPath", sensor: "sensorTemplate", property: "propertyTemplate", unit: "unit" };

function live(subscriptions, sparql, container, columns) {
  const rows = new Map();
  let vars = [];
  const render = () => {
    const table = document.createElement("table");
    table.className = "results";
    const head = table.createTHead().insertRow();
    for (const [, title] of columns) head.append(Object.assign(document.createElement("th"), { textContent: title }));
    const body = table.createTBody();
    for (const row of [...rows.values()].sort((a, b) => rowKey(a, vars).localeCompare(rowKey(b, vars)))) {
      const line = body.insertRow();
      for (const [name] of columns) line.insertCell().textContent = row[name] ? row[name].value : "";
    }
    container.replaceChildren(table);
  };
  subscriptions.subscribe(sparql, ({ reset, added, removed, vars: names }) => {
    vars = names;
    if (reset) rows.clear();
    for (const row of removed) rows.delete(rowKey(row, vars));
    for (const row of added) rows.set(rowKey(row, vars), row);
    schedule(render);
  }, (error) => { container.textContent = error; });
}

export class Mappings {
  constructor(session, subscriptions, elements) {
    this.session = session;
    this.elements = elements;
    this.graph = session.config.graphs.mappings;
    const graph = iri(this.graph);
    // OPTIONAL makes these re-evaluated subscriptions, but only when the mappings graph changes
    live(subscriptions, `PREFIX gw: <${GW}> SELECT ?id ?topic ?extract ?sensor ?property ?unit WHERE { GRAPH ${graph} {
      ?m a gw:TopicMapping ; gw:mappingId ?id ; gw:topicFilter ?topic ; gw:extract ?extract .
      OPTIONAL { ?m gw:sensorTemplate ?sensor } OPTIONAL { ?m gw:propertyTemplate ?property }
      OPTIONAL { ?m gw:unit ?unit } } }`, elements.mappings, [
      ["id", "id"], ["topic", "filter"], ["extract", "extract"], ["sensor", "sensor"], ["property", "property"], ["unit", "unit"],
    ]);
    live(subscriptions, `PREFIX gw: <${GW}> SELECT ?uri ?source WHERE { GRAPH ${graph} {
      ?o a gw:CoapObservation ; gw:uri ?uri . OPTIONAL { ?o gw:source ?source } } }`,
    elements.coap, [["uri", "observed CoAP resource"], ["source", "source"]]);
    elements.mappingForm.addEventListener("submit", (event) => { event.preventDefault(); this.addMapping(); });
    elements.coapForm.addEventListener("submit", (event) => { event.preventDefault(); this.addObservation(); });
  }

  async run(sparql, form) {
    this.elements.error.textContent = "";
    try {
      await this.session.update(sparql);
      form.reset();
    } catch (error) {
      this.elements.error.textContent = error.message;
    }
  }

  addMapping() {
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
    this.run(`INSERT DATA { GRAPH ${iri(this.graph)} { ${triples.join(" . ")} } }`, form);
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
