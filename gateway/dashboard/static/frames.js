// One render per animation frame at most, and at most one every MIN_GAP_MS, whatever arrives in
// between. Why: notifications come as fast as the sensors publish (100 sensors at 10 Hz is 1,000
// changes a second); the models take them at once, and the DOM is touched only by the renderers
// marked dirty. Why the gap: each render repaints what changed, and painting at 60 Hz what a person
// reads at a glance cost a headless Chromium ~40 % of a core for 10 sensors at 10 Hz; ten renders a
// second still show every reading of a 10 Hz sensor, well within the second a reading has to appear.

const MIN_GAP_MS = 100;
const dirty = new Set();
let pending = false;
let last = -Infinity;

function frame(now) {
  pending = false;
  last = now;
  const renderers = [...dirty];
  dirty.clear();
  for (const render of renderers) {
    try { render(); } catch (error) { console.warn("render failed", error); }
  }
}

export function schedule(render) {
  dirty.add(render);
  if (pending) return;
  pending = true;
  const wait = last + MIN_GAP_MS - performance.now();
  if (wait > 0) setTimeout(() => requestAnimationFrame(frame), wait);
  else requestAnimationFrame(frame);
}
