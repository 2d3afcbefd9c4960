// A console query, fetched and parsed off the page's main thread; only the rows the table draws
// come back, with their count. Why: a 90,000-row SELECT is ~12 MB of SPARQL JSON, and parsing it on
// the main thread held the page 663 ms in one task (and 234 ms in another), with every tile and
// the chart frozen meanwhile (Chromium, load average 16).

self.onmessage = async ({ data: { url, init, shown } }) => {
  try {
    const reply = await fetch(url, init);
    const text = await reply.text();
    let document = null;
    try { document = text ? JSON.parse(text) : null; } catch { document = text; }
    const bindings = document && document.results && document.results.bindings;
    if (Array.isArray(bindings)) {
      document.count = bindings.length;
      document.results.bindings = bindings.slice(0, shown);
    }
    self.postMessage({ status: reply.status, ok: reply.ok, document });
  } catch (error) {
    self.postMessage({ failed: String(error && error.message || error) });
  }
};
