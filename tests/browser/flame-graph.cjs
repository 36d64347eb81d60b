// node flame-graph.cjs URL SHOT.png FUNCTION...
// Opens a Firefox Profiler flame graph URL (…/flame-graph/) in headless Chromium (Debian's
// /usr/bin/chromium, or $CHROMIUM; npm's playwright-core through NODE_PATH). The graph is a
// canvas, so it is read by pointing: the pointer climbs the graph until the tooltip names one
// of FUNCTIONs (which must be siblings: one row), then crosses that row in STEPS even steps,
// noting which function each point is in. Screenshot to SHOT.png. Prints one JSON object:
//   {"widths": {"hot_a": 0.70, ...}   (share of the row's points in each function),
//    "tooltips": {"hot_a": "691ms (70%) hot_a … Overall 659 samples …"}, "errors": [...]}
// Exit 0 when every FUNCTION was found, 1 otherwise.
const { openPage } = require('./browser.cjs');

const [url, shot, ...functions] = process.argv.slice(2);
if (!url || !shot || !functions.length) {
  console.error('usage: node flame-graph.cjs URL SHOT.png FUNCTION...');
  process.exit(2);
}
// Points across the row: a width is known to 1/STEPS.
const STEPS = 200;
// Pixels the pointer climbs at a time: half a flame graph row (16 px).
const CLIMB = 8;

async function main() {
  const result = { widths: {}, tooltips: {}, errors: [] };
  const { browser, page } = await openPage(result.errors);
  try {
    try {
      await page.goto(url);
      const canvas = page.locator('.flameGraphCanvas');
      await canvas.waitFor();
      // The graph is drawn after the canvas appears.
      await page.waitForTimeout(1000);
      const box = await canvas.boundingBox();
      // The tooltip's first words: "691ms (70%) NAME …"; the name, and the whole text.
      const under = async (x, y) => {
        await page.mouse.move(x, y);
        const text = await page.$$eval('.tooltip', (els) =>
          els.map((e) => e.innerText.replace(/\s+/g, ' ').trim()).join(' '));
        return [text.split(' ')[2] || '', text];
      };
      let row = null;
      for (let y = box.y + box.height - CLIMB / 2; y > box.y && row === null; y -= CLIMB) {
        for (const share of [0.1, 0.5, 0.9]) {
          if (functions.includes((await under(box.x + box.width * share, y))[0])) {
            row = y;
            break;
          }
        }
      }
      if (row === null) throw new Error(`no row of the flame graph holds ${functions.join(' or ')}`);
      const hits = {};
      for (let i = 0; i < STEPS; i++) {
        const [name, text] = await under(box.x + box.width * (i + 0.5) / STEPS, row);
        hits[name] = (hits[name] || 0) + 1;
        if (functions.includes(name) && !result.tooltips[name]) result.tooltips[name] = text;
      }
      for (const name of functions) result.widths[name] = (hits[name] || 0) / STEPS;
    } catch (e) {
      result.errors.push(String(e).split('\n')[0]);
    }
    await page.screenshot({ path: shot });
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(result, null, 1));
  process.exit(functions.every((f) => result.tooltips[f]) ? 0 : 1);
}

main().catch((e) => {
  console.error(String(e));
  process.exit(1);
});
