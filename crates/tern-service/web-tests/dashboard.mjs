// Drives the tern dashboard in a real headless Chromium (Debian's, not a downloaded one) against
// a running `tern serve --http-listen`. Started by crates/tern/tests/dashboard.rs, which sets up
// the service and the data, and checks the outcome on disk afterwards.
//
// Env: TERN_DASH_URL, TERN_DASH_TOKEN (admin), TERN_DASH_SRC + TERN_DASH_DST + TERN_DASH_TOKEN_FILE
// (the slow job: local source to a tern:// daemon), TERN_DASH_XSS_SRC + TERN_DASH_XSS_DST (a job
// whose file name is markup and fails on a per-file error), TERN_DASH_OUT (screenshots),
// CHROMIUM (default /usr/bin/chromium); optional TERN_DASH_NODE_URL + TERN_DASH_NODE_TOKEN (a
// service that is node dtn-ui of cluster site-a: its Nodes panel).
//
// Prints one line per check ("dashboard: ok ...") and ends with "dashboard: all checks passed";
// exits 1 on the first failed check.
import { chromium } from 'playwright-core';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const URL_ = env('TERN_DASH_URL');
const TOKEN = env('TERN_DASH_TOKEN');
const OUT = env('TERN_DASH_OUT');
const XSS_LABEL = '<img src=x onerror=window.__xss=1> label';
const t0 = Date.now();
const secs = () => ((Date.now() - t0) / 1000).toFixed(1);
const measured = {};

function check(cond, what, detail) {
  if (!cond) throw new Error(`check failed: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  console.log(`dashboard: ok ${what} (${secs()} s)`);
}

const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** axe-core's WCAG 2.1 A/AA rules on what the page shows now. */
async function accessible(page, where) {
  // Evaluated through the DevTools protocol, which the page's CSP does not govern; the page
  // itself could never load this script.
  await page.evaluate(AXE);
  const r = await page.evaluate(() => window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } }));
  const bad = r.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', ')}`);
  check(bad.length === 0, `accessibility, axe WCAG 2.1 AA, ${r.passes.length} rules pass: ${where}`, bad);
}

/** Width and height from a PNG's IHDR chunk. */
function pngSize(buf) {
  check(buf.subarray(1, 4).toString() === 'PNG', 'screenshot is a PNG');
  return [buf.readUInt32BE(16), buf.readUInt32BE(20)];
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  // Root in a container has no user namespaces for Chromium's sandbox; the rest keeps it off
  // the network (the test machine has none) and quick to start.
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  timeout: 60000,
});
let failed = false;
let page = null;
try {
  // The service's certificate is self-signed (DIR/tls/cert.pem); the test trusts it this way.
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 }, colorScheme: 'light', deviceScaleFactor: 1 });
  ctx.setDefaultTimeout(15000);
  page = await ctx.newPage();
  const problems = [];
  const urls = [];
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => { if (m.type() === 'error' && !/status of 4\d\d/.test(m.text())) problems.push('console: ' + m.text()); });
  page.on('request', (r) => urls.push(r.url()));
  await page.addInitScript(() => {
    window.__xss = 0;
    window.__csp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
  });

  // ---- the page and its headers ----
  const resp = await page.goto(URL_ + '/');
  check(resp.ok() && page.url().endsWith('/ui/'), 'the root redirects to the dashboard', page.url());
  const csp = resp.headers()['content-security-policy'] || '';
  check(csp.includes("script-src 'self'") && csp.includes("default-src 'none'") && !csp.includes('unsafe'), 'strict Content-Security-Policy', csp);
  check(resp.headers()['x-content-type-options'] === 'nosniff', 'nosniff');

  // ---- sign in ----
  await accessible(page, 'sign-in');
  await page.fill('#token', 'tern_0000000000000000_' + '0'.repeat(64));
  await page.click('button[type=submit]');
  await page.getByText('unknown token').waitFor();
  check(true, 'a wrong token is refused with the API\'s message');
  await page.fill('#token', TOKEN);
  await page.click('button[type=submit]');
  await page.waitForSelector('#nav:not([hidden])');
  check((await page.textContent('#who-scope')) === 'admin', 'signed in as admin');
  check(await page.evaluate(() => sessionStorage.getItem('tern.token') !== null && localStorage.length === 0), 'token kept in sessionStorage only');
  await page.waitForSelector('.empty:not([hidden])');
  check(await page.isHidden('section.nodes'), 'a service alone shows no Nodes panel');

  // ---- a job whose file name and label are markup: shown as text, never run ----
  await page.click('nav a[data-view=submit]');
  await page.fill('#src', env('TERN_DASH_XSS_SRC'));
  await page.fill('#dst', env('TERN_DASH_XSS_DST'));
  await page.fill('#label', XSS_LABEL);
  await page.click('form button[type=submit]');
  await page.waitForURL(/#\/jobs\/\d+$/);
  const xssId = Number(page.url().split('/').pop());
  await page.waitForSelector('.job-head .badge[data-state=failed]', { timeout: 30000 });
  const errRow = page.locator('table.errors tbody tr').first();
  await errRow.waitFor();
  const errPath = await errRow.locator('td.path').textContent();
  check(errPath.includes('<img src=x onerror=window.__xss=1>.dat'), 'per-file error shows the file name as text', errPath);
  check((await errRow.textContent()).includes('a directory stands where this file should go'), 'per-file error shows its reason');
  check((await page.textContent('.job-head h1')) === XSS_LABEL, 'label shown as text');
  check(await page.evaluate(() => document.querySelectorAll('main img').length === 0 && window.__xss === 0), 'no markup from the API became an element or ran');

  // ---- a slow job: submit, watch it move and the chart draw ----
  await page.click('nav a[data-view=submit]');
  // The source picked with the file browser: the job root, then run42, then "use this folder".
  await page.click('#src-browse-open');
  await page.locator('#src-browse-list button').first().click();
  await page.locator('#src-browse-list button', { hasText: /^run42\/$/ }).click();
  await page.click('#src-browse-use');
  const picked = await page.inputValue('#src');
  check(picked.endsWith('/run42') && (await page.isHidden('#src-browse')), 'the file browser fills the source', picked);
  await page.fill('#src', env('TERN_DASH_SRC'));
  await page.fill('#dst', env('TERN_DASH_DST'));
  await page.fill('#label', 'run42 to archive');
  await page.click('details.adv summary');
  await page.fill('#bwlimit', '5M');
  await page.fill('#token_file', env('TERN_DASH_TOKEN_FILE'));
  await page.click('form button[type=submit]');
  await page.waitForURL(/#\/jobs\/\d+$/);
  const jobId = Number(page.url().split('/').pop());
  check(jobId > xssId, 'submitted from the form', jobId);
  await page.waitForSelector('.job-head .badge[data-state=running]', { timeout: 20000 });
  const pct = async () => Number(((await page.textContent('.pct .big')) || '').replace('%', '')) || 0;
  await page.waitForFunction(() => /^\d+%$/.test(document.querySelector('.pct .big').textContent), null, { timeout: 20000 });
  const p1 = await pct();
  const tA = Date.now();
  await page.waitForFunction((p) => Number(document.querySelector('.pct .big').textContent.replace('%', '')) >= p + 10, p1, { timeout: 15000 });
  const p2 = await pct();
  measured.progress_moved = `${p1}% -> ${p2}% in ${((Date.now() - tA) / 1000).toFixed(1)} s`;
  check(p2 > p1, 'progress moves', measured.progress_moved);
  // The rate needs the sampler's first samples; the ETA the API's average.
  await page.waitForFunction(() => /[kMG]B\/s$/.test(document.querySelector('.stats .stat:nth-child(1) .v').textContent));
  check(true, 'current rate shown: ' + (await page.textContent('.stats .stat:nth-child(1) .v')));
  await page.waitForFunction(() => /\d/.test(document.querySelector('.stats .stat:nth-child(3) .v').textContent));
  check(true, 'ETA shown: ' + (await page.textContent('.stats .stat:nth-child(3) .v')));

  // The chart: samples arrive about once a second and it redraws each time.
  const chartInk = () => page.evaluate(() => {
    const c = document.getElementById('chart');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const line = getComputedStyle(document.documentElement).getPropertyValue('--chart-line').trim();
    const rgb = [1, 3, 5].map((i) => parseInt(line.slice(i, i + 2), 16));
    // Plot area only (the axis labels are outside it): inked pixels, and those in the line's colour.
    const x0 = 80, y0 = 10, x1 = c.width - 14, y1 = c.height - 30;
    let ink = 0, stroke = 0, right = 0;
    for (let y = y0; y < y1; y++) for (let x = x0; x < x1; x++) {
      const i = (y * c.width + x) * 4;
      if (d[i + 3] > 8) ink++;
      if (d[i + 3] > 200 && Math.abs(d[i] - rgb[0]) + Math.abs(d[i + 1] - rgb[1]) + Math.abs(d[i + 2] - rgb[2]) < 60) { stroke++; right = Math.max(right, x); }
    }
    return { ink, stroke, right, label: c.getAttribute('aria-label') };
  });
  const samplesIn = (c) => Number(/ (\d+) samples/.exec(c.label)[1]);
  await page.waitForFunction(() => Number((/ (\d+) samples/.exec(document.getElementById('chart').getAttribute('aria-label')) || [0, 0])[1]) >= 3);
  const c1 = await chartInk();
  await page.waitForTimeout(2200);
  const c2 = await chartInk();
  measured.chart = { samples: [samplesIn(c1), samplesIn(c2)], line_px: [c1.stroke, c2.stroke], ink_px: [c1.ink, c2.ink], newest_x: [c1.right, c2.right] };
  check(c1.stroke > 40 && c1.ink > 1000, 'chart draws the series, not a blank region', measured.chart);
  // The y scale may change with a new peak; the newest point only moves right.
  check(samplesIn(c2) >= samplesIn(c1) + 1 && c2.right > c1.right, 'chart updates live (new samples, the line grew right in 2.2 s)', measured.chart);
  const chartPng = await page.locator('#chart').screenshot();
  const [cw, ch] = pngSize(chartPng);
  check(cw > 600 && ch >= 200 && chartPng.length > 4000, 'chart screenshot has size and content', { cw, ch, bytes: chartPng.length });
  const shot = await page.screenshot({ fullPage: false });
  writeFileSync(join(OUT, 'dashboard.png'), shot);
  check((await page.textContent('.job-head .badge')) === 'running', 'screenshot shows the running badge');

  // ---- cancel, then retry to success ----
  await page.click('button:has-text("Cancel")');
  await page.waitForSelector('.job-head .badge[data-state=canceled]', { timeout: 10000 });
  const pc = await pct();
  check(pc < 100, 'canceled mid-way', pc);
  await accessible(page, 'job page (canceled)');
  await page.click('button:has-text("Retry")');
  await page.waitForSelector('.job-head .badge[data-state=running], .job-head .badge[data-state=queued]', { timeout: 10000 });
  check(true, 'retried');
  await page.waitForSelector('.job-head .badge[data-state=succeeded]', { timeout: 60000 });
  check((await page.textContent('.pct .big')) === '100%', 'succeeded at 100%');
  writeFileSync(join(OUT, 'job-succeeded.png'), await page.screenshot());

  // ---- the list ----
  await page.click('nav a[data-view=jobs]');
  await page.waitForSelector(`tr[data-job="${jobId}"] .badge[data-state=succeeded]`);
  await page.waitForSelector(`tr[data-job="${xssId}"] .badge[data-state=failed]`);
  check((await page.textContent(`tr[data-job="${xssId}"] .title`)) === XSS_LABEL, 'list shows the markup label as text');
  check((await page.textContent(`tr[data-job="${xssId}"] td[data-k=Files]`)).includes('1 failed'), 'list shows failed files');
  await page.click('.chip:has-text("failed")');
  check((await page.locator('table.jobs tbody tr').count()) === 1, 'state filter');
  await page.click('.chip:has-text("all")');
  await page.evaluate(() => { location.hash = '#/jobs/999999'; });
  await page.getByText('no job 999999').waitFor();
  check(true, 'an unknown job id says so');
  await page.click('nav a[data-view=jobs]');
  await page.waitForSelector(`tr[data-job="${jobId}"]`);
  await accessible(page, 'job list');
  writeFileSync(join(OUT, 'jobs.png'), await page.screenshot());

  // ---- scheduled path tests: one path's history as an inline SVG chart ----
  const pathId = env('TERN_DASH_PATH_ID');
  const points = Number(env('TERN_DASH_PATH_POINTS'));
  await page.click('nav a[data-view=paths]');
  const pathSel = `section.path[data-id="${pathId}"]`;
  await page.waitForSelector(`${pathSel} svg.path-chart circle.pc-many`);
  const drawn = await page.evaluate(async ([sel, tok, id]) => {
    const r = await (await fetch(`/v1/path-tests/${id}/results`, { headers: { Authorization: 'Bearer ' + tok } })).json();
    const el = document.querySelector(sel);
    return { many: el.querySelectorAll('circle.pc-many').length, one: el.querySelectorAll('circle.pc-one').length, rtt: el.querySelectorAll('circle.pc-rtt').length,
      failed: el.querySelectorAll('.pt-failed').length, lines: el.querySelectorAll('polyline.pc-line').length, ok: r.results.filter((x) => x.ok).length, all: r.results.length };
  }, [pathSel, TOKEN, pathId]);
  check(drawn.many === points && drawn.one === points && drawn.rtt === points && drawn.ok === points, 'path chart: a point per successful result for each series', drawn);
  check(drawn.lines === 3 && drawn.failed >= 1 && drawn.failed <= drawn.all - drawn.ok, 'path chart: three lines and a mark per failed test', drawn);
  const pathPng = await page.locator(`${pathSel} svg.path-chart`).screenshot();
  const [pw, ph] = pngSize(pathPng);
  check(pw > 600 && ph >= 200 && pathPng.length > 4000, 'path chart screenshot has size and content', { pw, ph, bytes: pathPng.length });
  writeFileSync(join(OUT, 'path-chart.png'), pathPng);
  await accessible(page, 'paths');
  writeFileSync(join(OUT, 'paths.png'), await page.screenshot({ fullPage: true }));

  // ---- tokens: create (secret shown once), use it, revoke ----
  await page.click('nav a[data-view=tokens]');
  await page.fill('#t-name', 'collaborator <b>x</b>');
  await page.selectOption('#t-scope', 'read');
  await page.selectOption('#t-expires', '7d');
  await page.fill('#t-path', '/shared/run42');
  await page.click('form button[type=submit]');
  const secret = await page.inputValue('#new-secret');
  check(/^tern_[0-9a-f]{16}_[0-9a-f]{64}$/.test(secret), 'new token shown once');
  const newId = secret.split('_')[1];
  await accessible(page, 'tokens, with a new secret shown');
  writeFileSync(join(OUT, 'tokens.png'), await page.screenshot({ fullPage: true }));
  await page.waitForSelector(`tr[data-token="${newId}"]`);
  check((await page.textContent(`tr[data-token="${newId}"] td:nth-child(2)`)) === 'collaborator <b>x</b>', 'token name shown as text');
  const who = (t) => page.evaluate(async (tok) => (await fetch('/v1/whoami', { headers: { Authorization: 'Bearer ' + tok } })).status, t);
  check((await who(secret)) === 200, 'the new token works');

  // Signed in with the read token, the page offers no transfer actions and sees no jobs of others.
  await page.click('#signout');
  await page.fill('#token', secret);
  await page.click('button[type=submit]');
  await page.waitForSelector('#nav:not([hidden])');
  check(await page.isHidden('nav a[data-view=submit]') && await page.isHidden('nav a[data-view=tokens]'), 'read token: no submit, no tokens');
  await page.waitForSelector('.empty:not([hidden])');
  check((await page.locator('table.jobs tbody tr').count()) === 0, 'path-limited token sees only its own jobs');
  await page.click('#signout');
  await page.fill('#token', TOKEN);
  await page.click('button[type=submit]');
  await page.waitForSelector('#nav:not([hidden])');
  await page.click('nav a[data-view=tokens]');
  await page.click(`tr[data-token="${newId}"] button:has-text("Revoke")`);
  await page.click('#rv-confirm');
  await page.waitForSelector(`tr[data-token="${newId}"] .badge:has-text("revoked")`);
  check((await who(secret)) === 401, 'revoked token is refused');
  await page.click('#signout');
  await page.fill('#token', secret);
  await page.click('button[type=submit]');
  await page.getByText('was revoked').waitFor();
  check(true, 'signing in with the revoked token says so');

  // ---- a cluster node's Nodes panel ----
  if (process.env.TERN_DASH_NODE_URL) {
    const NODE_TOKEN = env('TERN_DASH_NODE_TOKEN');
    await page.goto(process.env.TERN_DASH_NODE_URL + '/ui/');
    await page.fill('#token', NODE_TOKEN);
    await page.click('button[type=submit]');
    const row = page.locator('section.nodes tr[data-node="dtn-ui"]');
    await row.waitFor();
    check((await page.textContent('#nodes-title')) === 'Nodes of cluster site-a', 'Nodes panel names the cluster');
    check((await row.locator('.badge').getAttribute('data-state')) === 'active' && await row.locator('.tag').isVisible(), 'this node is listed active and marked', await row.textContent());
    const cells = await row.locator('td.num').allTextContents();
    check(cells.length === 4 && cells[1] === '0' && /^\d+(\.\d+)? s ago$/.test(cells[3]) && /^(\d+\.\d\d|–)$/.test(cells[2]), 'rate, jobs, load and heartbeat age shown', cells);
    await accessible(page, 'Nodes panel');
    writeFileSync(join(OUT, 'nodes.png'), await page.screenshot({ fullPage: true }));
  } else {
    console.log('dashboard: no cluster node given (PostgreSQL missing?): the Nodes panel is not checked');
  }

  // ---- hygiene ----
  check(!urls.some((u) => u.includes(TOKEN.slice(-20)) || u.includes(secret.slice(-20))), 'no token in any URL', urls.length);
  check(await page.evaluate(() => window.__csp.length === 0 && window.__xss === 0), 'no CSP violation, no script from data', await page.evaluate(() => window.__csp));
  check(problems.length === 0, 'no page errors', problems);

  // ---- dark scheme and a phone-sized screen ----
  const dark = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 390, height: 844 }, colorScheme: 'dark' });
  const dp = await dark.newPage();
  await dp.goto(URL_ + '/ui/');
  await dp.fill('#token', TOKEN);
  await dp.click('button[type=submit]');
  await dp.waitForSelector(`tr[data-job="${jobId}"]`);
  const bg = await dp.evaluate(() => getComputedStyle(document.body).backgroundColor);
  check(bg === 'rgb(13, 17, 23)', 'dark scheme follows the system', bg);
  await accessible(dp, 'job list, dark, 390 px');
  const overflow = await dp.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, 'no sideways scrolling at 390 px', overflow);
  writeFileSync(join(OUT, 'jobs-dark-phone.png'), await dp.screenshot({ fullPage: true }));
  await dp.click(`tr[data-job="${jobId}"] .title`);
  await dp.waitForSelector('.job-head .badge[data-state=succeeded]');
  const overflowJob = await dp.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflowJob <= 1, 'job page: no sideways scrolling at 390 px', overflowJob);
  await accessible(dp, 'job page, dark, 390 px');
  writeFileSync(join(OUT, 'job-dark-phone.png'), await dp.screenshot({ fullPage: true }));
  await dark.close();

  console.log('dashboard: measured ' + JSON.stringify(measured));
  console.log(`dashboard: all checks passed in ${secs()} s`);
} catch (e) {
  failed = true;
  console.log('dashboard: FAILED: ' + e.message);
  if (page) await page.screenshot({ path: join(OUT, 'failure.png') }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
