// Renders run in an animation frame, each at most once every `gap` ms (its own), whatever arrives
// in between. Why: notifications come as fast as the sensors publish (100 sensors at 10 Hz is 1,000
// changes a second); the models take them at once, and the DOM is touched only by the renderers
// marked dirty. Why the gaps: every render repaints what changed, and a headless Chromium painting
// at 60 Hz what a person reads at a glance took ~45 % of a core for 10 sensors at 10 Hz. Five
// renders a second still show a reading well within the second it has to appear in.

export const MIN_GAP_MS = 200;
const due = new Map(); // render -> earliest time it may run
const lastRun = new Map(); // render -> when it last ran
let armed = false;

function frame() {
  armed = false;
  const now = performance.now();
  for (const [render, at] of [...due]) {
    if (at > now + 1) continue;
    due.delete(render);
    lastRun.set(render, now);
    try { render(); } catch (error) { console.warn("render failed", error); }
  }
  if (due.size) arm();
}

function arm() {
  if (armed) return;
  armed = true;
  const wait = Math.min(...due.values()) - performance.now();
  if (wait > 0) setTimeout(() => requestAnimationFrame(frame), wait);
  else requestAnimationFrame(frame);
}

export function schedule(render, gap = MIN_GAP_MS) {
  if (due.has(render)) return;
  due.set(render, Math.max(performance.now(), (lastRun.get(render) ?? -Infinity) + gap));
  arm();
}
