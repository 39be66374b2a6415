// tests/sdk/page_test.mjs BASE_URL — the chat page at GET / in headless Chromium (Debian's
// /usr/bin/chromium, driven by playwright-core): type a message, send it, and see an answer
// stream in; then a follow-up turn. Prints `N passed, N failed, N skipped`.
import { chromium } from 'playwright-core';

const [base] = process.argv.slice(2);
let passed = 0, failed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error('FAIL:', what); } };
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'] });
try {
  const page = await browser.newPage();
  const external = [];
  page.on('request', (r) => { if (!r.url().startsWith(base)) external.push(r.url()); });
  await page.goto(base + '/');
  check((await page.title()) === 'pensieve', 'page title');
  await page.waitForFunction(() => document.getElementById('model').textContent.length > 0, null, { timeout: 10000 });
  check(true, 'model name shown');
  // watch the answer grow: at least two different non-empty states before it is done
  await page.fill('#input', 'Hello there!');
  await page.click('#send');
  const seen = new Set();
  const t0 = Date.now();
  let state = '';
  while (Date.now() - t0 < 60000) {
    const s = await page.evaluate(() => { const m = [...document.querySelectorAll('.msg.assistant, .msg.error')].at(-1);
      return m ? [m.dataset.state, m.textContent] : ['', '']; });
    state = s[0];
    if (s[1]) seen.add(s[1]);
    if (state === 'done' || state === 'error') break;
    await page.waitForTimeout(20);
  }
  check(state === 'done', 'answer finished: ' + state);
  const answer = await page.evaluate(() => [...document.querySelectorAll('.msg.assistant')].at(-1).textContent);
  check(answer.length > 0, 'answer has text');
  check(seen.size >= 2, `answer streamed in pieces (${seen.size} states seen)`);
  check((await page.locator('.msg.user').count()) === 1, 'user message shown');
  // a second turn carries the conversation
  await page.fill('#input', 'And again?');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2 &&
    document.querySelectorAll('.msg.assistant')[1].dataset.state === 'done', null, { timeout: 60000 });
  check(true, 'second turn answered');
  check(external.length === 0, 'no requests leave the server: ' + external.join(' '));
} catch (e) {
  check(false, 'unexpected: ' + (e.stack || e));
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed, 0 skipped`);
process.exit(failed ? 1 : 0);
