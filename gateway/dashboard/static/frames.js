// One render per animation frame, whatever arrives in between. Why: notifications come as fast as
// the sensors publish (100 sensors at 10 Hz is 1,000 changes a second); the models take them at
// once, and the DOM is touched only by the renderers marked dirty, at most once a frame.

const dirty = new Set();
let requested = false;

function frame() {
  requested = false;
  const renderers = [...dirty];
  dirty.clear();
  for (const render of renderers) {
    try { render(); } catch (error) { console.warn("render failed", error); }
  }
}

export function schedule(render) {
  dirty.add(render);
  if (!requested) {
    requested = true;
    requestAnimationFrame(frame);
  }
}
