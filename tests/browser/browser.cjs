// What the browser drivers of this folder share: headless Chromium (Debian's
// /usr/bin/chromium, or $CHROMIUM) through npm's playwright-core (found through NODE_PATH),
// which never downloads a browser of its own.
const { chromium } = require('playwright-core');

// Generous: on a busy 2-core machine the app alone takes tens of seconds to start.
const TIMEOUT_MS = Number(process.env.BROWSER_TIMEOUT_MS || 120000);

// Starts the browser and a 1600x1000 page whose errors are pushed onto `errors`; the
// caller closes the browser.
async function openPage(errors) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-quic'],
  });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  page.setDefaultTimeout(TIMEOUT_MS);
  // The app's service worker is left out of the local build: its registration fails.
  page.on('pageerror', (e) => {
    if (!/ServiceWorker/.test(String(e))) errors.push(String(e));
  });
  return { browser, page };
}

module.exports = { openPage };
