// Actuators: controls that send updates. Each kind is described in actuators.json (its graph, a
// SELECT ?target ?state listing the actuators and their state, the states to offer, and the update
// that sets one, whose VALUES_TARGET_NEW is replaced by a VALUES clause binding ?target and ?new),
// so that a site adds its own kinds without code.
//
// Shown only to clients allowed to write: the gateway's rights endpoint (GET /secure/rights) says
// which graphs this client may write now; a kind whose graph is not among them gets no control
// (and no subscription). The gateway still checks every update it is sent.

import { mayWrite } from "./session.js";
import { schedule } from "./frames.js";
import { iri, shortName } from "./terms.js";

export class Actuators {
  // `error`: why a control's update was refused, or why the list stopped (it showed nothing)
  constructor(session, subscriptions, panel, container, error, rights) {
    this.session = session;
    this.container = container;
    this.error = error;
    this.kinds = [];
    this.rows = new Map(); // kind id -> Map(target -> state)
    this.render = () => this.draw();
    this.start(subscriptions, panel, rights);
  }

  async start(subscriptions, panel, rights) {
    const kinds = await (await fetch("/dashboard/actuators.json")).json();
    this.kinds = kinds.filter((kind) => mayWrite(rights, kind.graph));
    panel.hidden = this.kinds.length === 0;
    for (const kind of this.kinds) {
      const rows = new Map();
      this.rows.set(kind.id, rows);
      subscriptions.subscribe(kind.list, ({ reset, added, removed }) => {
        if (reset) rows.clear();
        for (const row of removed) if (rows.get(row.target.value) === row.state.value) rows.delete(row.target.value);
        for (const row of added) rows.set(row.target.value, row.state.value);
        schedule(this.render);
      }, (error) => { this.error.textContent = error ? `${kind.title}: no longer updated: ${error}` : ""; }, { retry: true });
    }
  }

  async set(kind, target, state) {
    const values = `VALUES (?target ?new) { (${iri(target)} ${iri(state)}) }`;
    this.error.textContent = "";
    try {
      // a function, not the string: `$$`, `$&`, `$'` in a replacement string are patterns, and an
      // IRI may hold them (a lamp named `...Lamp9$$` had the click set `...Lamp9$`)
      await this.session.update(kind.set.replace("VALUES_TARGET_NEW", () => values));
    } catch (error) {
      this.error.textContent = `${shortName(target)} not set: ${error.message}`;
    }
  }

  draw() {
    const sections = [];
    for (const kind of this.kinds) {
      const section = document.createElement("div");
      section.className = "actuator-kind";
      const heading = document.createElement("h3");
      heading.textContent = kind.title;
      section.append(heading);
      const rows = [...this.rows.get(kind.id)].sort(([a], [b]) => a.localeCompare(b));
      if (rows.length === 0) section.append(Object.assign(document.createElement("p"), { textContent: "none yet" }));
      for (const [target, current] of rows) {
        const line = document.createElement("div");
        line.className = "actuator";
        line.dataset.target = target;
        line.dataset.state = current;
        const name = document.createElement("span");
        name.textContent = `${shortName(target)}: ${shortName(current)}`;
        line.append(name);
        for (const state of kind.states) {
          const button = document.createElement("button");
          button.type = "button";
          button.className = "actuator-control";
          button.dataset.state = state.value;
          button.textContent = state.label;
          button.disabled = state.value === current;
          button.addEventListener("click", () => this.set(kind, target, state.value));
          line.append(button);
        }
        section.append(line);
      }
      sections.push(section);
    }
    this.container.replaceChildren(...sections);
  }
}
