// node source-view.cjs URL SHOT_PREFIX FUNCTION...
// Opens a Firefox Profiler call tree URL in headless Chromium (Debian's /usr/bin/chromium, or
// $CHROMIUM; npm's playwright-core through NODE_PATH) and, for each FUNCTION in turn,
// double-clicks the first call tree row of that function, which opens the function's file
// in the bottom box's source view, and screenshots the page (SHOT_PREFIX-FUNCTION.png).
// Prints one JSON object:
//   {"views": [{"function": "hot_a", "ok": bool, "file": "the file the row and box name",
//     "lines": [{"line": 16, "text": "...", "total": 659, "self": 0}, ...],
//     "unavailable": "the box's error text, if any", "error": "why it stopped, if it did"}],
//    "errors": ["page errors, or why the page did not load"]}
// Counts are those the gutters show (an empty cell is 0). Lines are matched to their gutter
// cells by their height on the screen: CodeMirror draws a timing cell only for lines with
// samples. Exit 0 when every function's file was shown with its text, 1 otherwise.
const { openPage } = require('./browser.cjs');

const [url, shotPrefix, ...functions] = process.argv.slice(2);
if (!url || !shotPrefix || !functions.length) {
  console.error('usage: node source-view.cjs URL SHOT_PREFIX FUNCTION...');
  process.exit(2);
}

async function main() {
  const result = { views: [], errors: [] };
  const { browser, page } = await openPage(result.errors);
  try {
    try {
      await page.goto(url);
      await page.waitForSelector('.treeViewRowScrolledColumns');
    } catch (e) {
      result.errors.push(String(e).split('\n')[0]);
    }
    for (const fn of result.errors.length ? [] : functions) {
      result.views.push(await showSource(page, fn, `${shotPrefix}-${fn}.png`));
    }
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(result, null, 1));
  const ok = result.views.length === functions.length && result.views.every((v) => v.ok);
  process.exit(ok ? 0 : 1);
}

// Double-clicks FUNCTION's first call tree row and reads the source view it opens; a
// screenshot of the page goes to SHOT.
async function showSource(page, fn, shot) {
  const view = { function: fn, ok: false, file: '', lines: [], unavailable: '', error: '' };
  try {
    // The row's name cell says the function (an inlined one after "(inlined)"), then its
    // file or library.
    const [index, file] = await page.$$eval('.treeViewRowScrolledColumns', (rows, name) => {
      const words = rows.map((r) => r.innerText.replace(/^\(inlined\)/, '').trim().split(/\s+/));
      const i = words.findIndex((w) => w[0] === name);
      return [i, i < 0 ? '' : words[i].slice(1).join(' ')];
    }, fn);
    if (index < 0) throw new Error(`no call tree row for ${fn}`);
    await page.locator('.treeViewRowScrolledColumns').nth(index).dblclick();
    // The box names the row's file once it shows it; then either its text or an error.
    await page.waitForFunction(([name, path]) => {
      const title = document.querySelector('.bottom-box-title');
      return title && title.innerText.trim() === path && (
        document.querySelector('.sourceCodeErrorOverlay') ||
        [...document.querySelectorAll('.sourceView .cm-line')].some((e) => e.innerText.includes(name)));
    }, [fn, file]);
    // The timing gutters fill in once the source is laid out; give them a moment.
    await page.waitForTimeout(1000);
    view.file = await page.$eval('.bottom-box-title', (e) => e.innerText.trim()).catch(() => '');
    view.unavailable = await page.$$eval('.sourceCodeErrorOverlay',
      (els) => els.map((e) => e.innerText.replace(/\s+/g, ' ').trim()).join(' '));
    view.lines = await page.$eval('.sourceView', readLines);
    view.ok = view.lines.some((l) => l.text.includes(fn));
  } catch (e) {
    view.error = String(e).split('\n')[0];
  }
  await page.screenshot({ path: shot });
  return view;
}

// In the page: each drawn source line with its number and the counts beside it.
function readLines(view) {
  const top = (e) => Math.round(e.getBoundingClientRect().top);
  const byTop = (selector) => {
    const cells = new Map();
    for (const e of view.querySelectorAll(selector)) {
      if (e.style.visibility !== 'hidden') cells.set(top(e), e.innerText.trim());
    }
    return cells;
  };
  const numbers = byTop('.cm-lineNumbers .cm-gutterElement');
  const total = byTop('.cm-total-timings-gutter .cm-gutterElement');
  const self = byTop('.cm-self-timings-gutter .cm-gutterElement');
  const count = (text) => (text ? Number(text.replace(/[^\d]/g, '')) : 0);
  return [...view.querySelectorAll('.cm-content .cm-line')].map((e) => {
    const at = top(e);
    return {
      line: Number(numbers.get(at)),
      text: e.innerText,
      total: count(total.get(at)),
      self: count(self.get(at)),
    };
  });
}

main().catch((e) => {
  console.error(String(e));
  process.exit(1);
});
