// SPARQL JSON terms: showing them, and writing them back into SPARQL text safely.

const UNITS = {
  DEG_C: "°C", DEG_F: "°F", K: "K", PERCENT: "%", PERCENT_RH: "%RH", HectoPA: "hPa", PA: "Pa", LUX: "lx",
  PPM: "ppm", W: "W", KiloW: "kW", KiloW_HR: "kWh", V: "V", A: "A",
};

// The last segment of an IRI, its %-escapes decoded when they are UTF-8. A legal IRI may hold an
// escape that is not (urn:s:bad%E0): shown raw, since decodeURIComponent throws on it, and one tile
// that threw stopped every tile after it from being drawn.
export function shortName(iri) {
  const text = String(iri || "");
  const cut = Math.max(text.lastIndexOf("/"), text.lastIndexOf("#"), text.lastIndexOf(":"));
  if (cut < 0 || cut >= text.length - 1) return text;
  const name = text.slice(cut + 1);
  try {
    return decodeURIComponent(name);
  } catch {
    return name;
  }
}

export function unitSymbol(iri) {
  if (!iri) return "";
  const name = shortName(iri);
  // own keys only: a unit IRI ending in "constructor" or "__proto__" named Object's inherited members
  return Object.hasOwn(UNITS, name) ? UNITS[name] : name;
}

export function formatValue(term) {
  if (!term) return "";
  if (term.type === "triple") return termText(term); // its value is an object: "[object Object]"
  if (term.type === "literal" && /#(double|decimal|float)$/.test(term.datatype || "")) {
    const number = Number(term.value);
    if (Number.isFinite(number)) return Math.abs(number) >= 1000 ? number.toFixed(0) : String(+number.toPrecision(4));
  }
  return term.value;
}

export function termText(term) {
  if (!term) return "";
  if (term.type === "uri") return `<${term.value}>`;
  if (term.type === "triple") { // RDF 1.2: its value is {subject, predicate, object}, each a term
    const { subject, predicate, object } = term.value;
    return `<<( ${termText(subject)} ${termText(predicate)} ${termText(object)} )>>`;
  }
  if (term.type === "bnode") return `_:${term.value}`;
  const datatype = term.datatype && !term.datatype.endsWith("#string") ? `^^<${shortName(term.datatype)}>` : "";
  const language = term["xml:lang"] ? `@${term["xml:lang"]}` : "";
  return `"${term.value}"${language}${datatype}`;
}

// An IRI as SPARQL text, refused if it could change the shape of the request.
export function iri(value) {
  if (!value || /[\s<>"{}|^`\\]/.test(value)) throw new Error(`not an IRI: ${value}`);
  return `<${value}>`;
}

// A string literal: JSON's escapes are all valid SPARQL escapes.
export function literal(value) {
  return JSON.stringify(String(value));
}

// A row's identity among a subscription's rows: every part of each term (type, value, language,
// datatype; a triple term's three terms), each prefixed with its length, so that no two rows share
// one. Why: it was the types and values joined with U+0001, so "21" as an integer, as a double and
// in English were one row (counted once; the double's removal left its text shown), a sensor's
// value holding U+0001 could make its row one with another row and hide it, and every triple term
// (its value an object) was "[object Object]".
export function rowKey(row, vars) {
  return vars.map((name) => (row[name] ? termKey(row[name]) : "-")).join("");
}

function termKey(term) {
  if (term.type === "triple") {
    const { subject, predicate, object } = term.value;
    return sized(term.type) + termKey(subject) + termKey(predicate) + termKey(object);
  }
  return sized(term.type) + sized(term.value) + sized(term["xml:lang"] || "") + sized(term.datatype || "");
}

function sized(text) {
  return `${text.length}:${text}`;
}
