// Drives the console in Debian's Chromium (headless) with playwright-core, as an
// operator would: checks the dead-letter causes and counts on the page, opens one
// cause, previews its replay, runs it, and checks the result and the audit row.
// Prints one JSON line with what it saw; exits 1 with the reason on any mismatch.
//
//   node browser_test.cjs <console url> <output dir> <expected json>
// expected: {"causes": [{"reason": "non_retryable", "count": 40}, ...], "replay_reason": "...",
//            "requested_by": "..."}
// Environment: IDEMKAFKA_PLAYWRIGHT_MODULES, the node_modules dir of scripts/playwright.sh.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const { chromium } = require(path.join(process.env.IDEMKAFKA_PLAYWRIGHT_MODULES, 'playwright-core'));

const [url, outDir, expectedText] = process.argv.slice(2);
const expected = JSON.parse(expectedText);
const timeout = 30000;

function fail(message) {
  throw new Error(message);
}

async function causeRows(page) {
  return page.$$eval('#causes tbody tr', (rows) => rows.map((r) => ({
    cause: r.dataset.cause,
    count: Number(r.querySelector('.count').textContent),
    reason: r.querySelector('.reason').textContent,
    pattern: r.querySelector('.pattern').textContent,
  })));
}

async function checkCauses(page) {
  const rows = await causeRows(page);
  const want = expected.causes;
  if (rows.length !== want.length)
    fail(`${rows.length} causes on the page, expected ${want.length}: ${JSON.stringify(rows)}`);
  want.forEach((w, i) => {
    if (rows[i].reason !== w.reason || rows[i].count !== w.count)
      fail(`cause ${i}: ${rows[i].count} x ${rows[i].reason}, expected ${w.count} x ${w.reason}`);
  });
  return rows;
}

async function noErrors(page) {
  const errors = await page.textContent('#errors');
  if (errors.trim() !== '') fail(`the page shows errors: ${errors}`);
}

async function replayOneCause(page, rows) {
  const target = rows.find((r) => r.reason === expected.replay_reason);
  if (!target) fail(`no cause with reason ${expected.replay_reason}`);
  await page.click(`#causes tr[data-cause="${target.cause}"] button[data-testid="open-cause"]`);
  await page.waitForSelector('#records tbody tr', { timeout });
  const shown = await page.$$eval('#records tbody tr', (r) => r.length);
  if (shown !== Math.min(target.count, 200)) fail(`${shown} records shown for a cause of ${target.count}`);
  await page.fill('#requested-by', expected.requested_by);
  await page.click('#preview');
  const preview = `Preview: ${target.count} matching, ${target.count} would be replayed`;
  await page.waitForFunction((t) => document.querySelector('#replay-result').textContent.startsWith(t), preview,
    { timeout });
  await page.waitForSelector('#replay:not([disabled])', { timeout });
  await page.click('#replay');
  await page.waitForFunction(() => /^Replay \d+: /.test(document.querySelector('#replay-result').textContent),
    null, { timeout });
  const result = await page.textContent('#replay-result');
  const m = /^Replay (\d+): (\d+) published, (\d+) failed/.exec(result);
  if (!m || Number(m[2]) !== target.count || Number(m[3]) !== 0) fail(`replay result: ${result}`);
  return { cause: target.cause, count: target.count, audit_id: Number(m[1]), preview, result };
}

async function checkAudit(page, replay) {
  await page.waitForFunction((id) => [...document.querySelectorAll('#audit tbody tr')]
    .some((r) => r.cells[0].textContent === String(id)), replay.audit_id, { timeout });
  const row = await page.$$eval('#audit tbody tr', (rows, id) => {
    const r = rows.find((x) => x.cells[0].textContent === String(id));
    return { by: r.cells[2].textContent, published: Number(r.cells[6].textContent), outcome: r.cells[9].textContent };
  }, replay.audit_id);
  if (row.by !== expected.requested_by || row.published !== replay.count || row.outcome !== 'done')
    fail(`audit row: ${JSON.stringify(row)}`);
  return row;
}

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'idemkafka-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 1000 },
  });
  const page = context.pages()[0] || await context.newPage();
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  try {
    const started = Date.now();
    await page.goto(url, { timeout });
    await page.waitForSelector('body[data-loaded="true"]', { timeout });
    const loadMs = Date.now() - started;
    await noErrors(page);
    const rows = await checkCauses(page);
    const mode = await page.textContent('#mode');
    if (mode !== 'replay allowed') fail(`mode: ${mode}`);
    const replay = await replayOneCause(page, rows);
    const audit = await checkAudit(page, replay);
    await noErrors(page);
    if (consoleErrors.length) fail(`script errors on the page: ${consoleErrors.join('; ')}`);
    await page.screenshot({ path: path.join(outDir, 'console.png'), fullPage: true });
    console.log(JSON.stringify({ load_ms: loadMs, causes: rows, replay, audit }));
  } catch (e) {
    await page.screenshot({ path: path.join(outDir, 'console-failure.png'), fullPage: true }).catch(() => {});
    throw e;
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error('browser test: ' + e.message);
  process.exit(1);
});
