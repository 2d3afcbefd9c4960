// Delayed updates: the list (GET scheduled: on the HTTPS port, this client's own), and cancel.

export class Scheduled {
  constructor(session, panel, container, refresh) {
    this.session = session;
    this.container = container;
    refresh.addEventListener("click", () => this.load());
    panel.addEventListener("toggle", () => { if (panel.open) this.load(); });
  }

  // the first page (`after` null) replaces the list; a later one is appended under it
  async load(after = null) {
    let pending;
    try {
      pending = await this.session.scheduled(after);
    } catch (error) {
      this.container.textContent = error.message;
      return;
    }
    const list = pending.scheduled; // in due order; on the HTTPS port this client's own
    if (after === null && list.length === 0) {
      this.container.textContent = "no delayed update pending";
      return;
    }
    let table = after === null ? null : this.container.querySelector("table");
    if (!table) {
      table = document.createElement("table");
      table.className = "results";
      const head = table.createTHead().insertRow();
      for (const name of ["due", "update", ""]) head.append(Object.assign(document.createElement("th"), { textContent: name }));
      table.createTBody();
      this.container.replaceChildren(table);
    }
    const body = table.tBodies[0];
    for (const item of list) {
      const row = body.insertRow();
      row.dataset.id = item.id;
      row.insertCell().textContent = item.due;
      row.insertCell().append(Object.assign(document.createElement("code"), { textContent: item.update }));
      const cancel = Object.assign(document.createElement("button"), { type: "button", textContent: "Cancel" });
      cancel.addEventListener("click", async () => {
        try { await this.session.cancel(item.id); } catch (error) { row.title = error.message; }
        this.load();
      });
      row.insertCell().append(cancel);
    }
    this.container.querySelector("button.more")?.remove();
    if (pending.next) { // more follow: a page at a time, on demand
      const more = Object.assign(document.createElement("button"), { type: "button", className: "more", textContent: "More" });
      more.addEventListener("click", () => this.load(pending.next));
      this.container.append(more);
    }
  }
}
