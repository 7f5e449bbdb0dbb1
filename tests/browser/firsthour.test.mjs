// What a new operator meets in the first hour, in the console: charts whose time axis fits a
// minute of traffic, with 24-hour ticks in an en-US browser, attempts not painted as failures; an
// error above the Profiles forms taken away by the next success; the paid box on a profile; the
// Alerts view with a test send through a real webhook receiver; and an agent's setup lines.

import assert from 'node:assert/strict';
import { createServer } from 'node:http';

import { docShot, e2e, newPage, signIn, waitUntil } from './harness.mjs';

/** A webhook receiver on loopback: every body posted to it, answered 204. */
async function receiver() {
  const got = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      got.push({ path: req.url, body: JSON.parse(body) });
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { got, url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

const hook = await receiver();
const RULES = `
[[alerts]]
name = "chat"
on = ["disabled", "paid"]
url = "${hook.url}/services/T0/B0/s3cret-path"
format = "slack"
`;

e2e('the first hour: charts fit the traffic, errors clear, paid, alerts with a test send, setup lines', { extraToml: RULES, timeoutMs: 180_000 }, async (t, env) => {
  t.after(() => hook.close());
  const { rota } = env;
  const page = await newPage(env.browser, { width: 1440, locale: 'en-US', timezoneId: 'UTC' });
  await signIn(page, rota);

  // -- Profiles: a refused key's error, then a success that takes it away ------------------------
  const corp = page.locator('section[data-provider="corp"]');
  await corp.locator('[data-action="add-key"]').click();
  await page.locator('#key-name').fill('k1');
  await page.locator('#key-secret').fill('sk-with a space');
  await page.locator('#key-submit').click();
  const errors = page.locator('#view-profiles .notices .notice[data-kind="error"]');
  await errors.first().waitFor();
  assert.match(await errors.first().innerText(), /whitespace/);
  await page.locator('#key-secret').fill('sk-corp-first-hour');
  await page.locator('#key-submit').click();
  await page.locator('#view-profiles .notice[data-kind="info"]', { hasText: 'Added corp:k1' }).waitFor();
  assert.equal(await errors.count(), 0, 'the success took the old error away');

  // -- the paid box: the badge, the API, the Changes tab -------------------------------------------
  const row = page.locator('tr[data-profile="corp:k1"]');
  await row.locator('input[data-action="paid"]').check();
  await row.locator('.badge.paid').waitFor();
  assert.equal((await rota.profile('corp:k1')).paid, true);
  await row.locator('input[data-action="paid"]').uncheck();
  await waitUntil(async () => (await row.locator('.badge.paid').count()) === 0, { message: 'the badge goes' });
  assert.equal((await rota.profile('corp:k1')).paid, false);
  await row.locator('input[data-action="paid"]').check();
  await row.locator('.badge.paid').waitFor();

  // -- a minute of traffic: the charts' axis fits it, 24-hour ticks, attempts not red -----------
  for (let i = 0; i < 3; i += 1) assert.equal((await rota.chat()).status, 200);
  await page.locator('#tab-overview').click();
  await page.locator('figure[data-chart="requests"][data-ticks]').waitFor({ state: 'attached' });
  await page.locator('figure[data-chart="share"] canvas').first().waitFor();
  const charts = page.locator('#charts');
  const [since, until, from, step] = await Promise.all(['data-since', 'data-until', 'data-shown-from', 'data-step'].map((a) => charts.getAttribute(a).then(Number)));
  assert.ok(until - since >= 3_600_000, 'the window asked for is the hour');
  assert.ok(until - from <= 15 * step && until - from >= 10 * step, `the axis shows ${(until - from) / 60_000} min of the hour`);
  const ticks = (await page.locator('figure[data-chart="requests"]').getAttribute('data-ticks')).split(' ');
  assert.ok(ticks.length >= 2, `ticks: ${ticks}`);
  for (const tick of ticks) assert.match(tick, /^([01]\d|2[0-3]):[0-5]\d$/, `a 24-hour tick, not ${tick}`);
  const marker = page.locator('figure[data-chart="share"] .u-legend .u-series', { hasText: 'attempts' }).locator('.u-marker');
  const color = await marker.evaluate((m) => getComputedStyle(m).backgroundColor);
  assert.notEqual(color, 'rgb(224, 49, 49)', 'attempts are not painted as failures');
  assert.match(await page.locator('#view-overview .zone').first().innerText(), /Times in UTC/);

  // -- Alerts: the rule without its URL's path, a test send delivered, recorded ------------------
  await page.locator('#tab-alerts').click();
  const rule = page.locator('#alert-rules tr[data-rule="chat"]');
  await rule.waitFor();
  assert.match(await rule.innerText(), new RegExp(hook.url.replace(/[.]/g, '\\.')));
  assert.ok(!(await page.content()).includes('s3cret'), 'the webhook path is not in the page');
  await rule.locator('[data-action="test"]').click();
  await page.locator('#view-alerts .notice[data-kind="info"]').waitFor();
  const test = page.locator('#alerts tr[data-kind="test"][data-state="delivered"]');
  await waitUntil(async () => {
    if ((await test.count()) === 1) return true;
    await page.locator('#tab-alerts').click();
    return false;
  }, { message: 'the test alert listed as delivered', deadlineMs: 15_000, intervalMs: 500 });
  assert.match(await test.locator('.deliveries').innerText(), /204 delivered/);
  const posted = hook.got.find((g) => g.body.text.includes('a test of the alert rule chat, sent by ops'));
  assert.equal(posted?.path, '/services/T0/B0/s3cret-path');
  // The requests the paid profile served raised the paid alert, once in the interval.
  assert.equal(await page.locator('#alerts tr[data-kind="paid"][data-state="delivered"]').count(), 1);
  assert.equal(hook.got.length, 2);
  await docShot(page, 'alerts-1440');
  await page.locator('#tab-changes').click();
  await page.locator('#changes tr[data-action="alert.test"]').waitFor();
  assert.equal(await page.locator('#changes tr[data-action="profile.paid"]').count(), 3);

  // -- Agents: setup lines for an agent, and at creation with its key ------------------------------
  await page.locator('#tab-agents').click();
  await page.locator('tr[data-agent="ops"] [data-action="setup"]').click();
  const codex = page.locator('#agent-setup pre[data-client="codex"]');
  await codex.waitFor();
  assert.match(await codex.innerText(), new RegExp(`base_url = "${rota.url.replace(/[.]/g, '\\.')}/v1"`));
  assert.match(await codex.innerText(), /model = "corp\/gpt-4o-mini"/);
  assert.match(await page.locator('#agent-setup pre[data-client="key"]').innerText(), /^export ROTA_AGENT_KEY=…/);
  await page.locator('#agent-name').fill('coder');
  await page.locator('#agent-create').click();
  const key = (await page.locator('#new-key').innerText()).trim();
  assert.match(key, /^rk_/);
  assert.equal(await page.locator('#agent-key pre[data-client="key"]').innerText(), `export ROTA_AGENT_KEY=${key}`);
  assert.match(await page.locator('#agent-key pre[data-client="claude-code"]').innerText(), new RegExp(`ANTHROPIC_BASE_URL=${rota.url.replace(/[.]/g, '\\.')} `));
});
