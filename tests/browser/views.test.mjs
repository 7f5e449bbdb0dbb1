// The console's views after real traffic: the overview's charts against the API, the requests
// view (a 429 → rotate → fallback request as one row of three attempts, a refused 404), profile
// rows in the engine's order, the agents page, buttons inside their cards at 1440 and 390 px,
// and an axe-core scan of every view at both widths. Screenshots of each view go to artifacts/
// (and docs/img/ with ROTA_DOC_SHOTS=1: scripts/screenshots.sh).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { axeScan, docShot, e2e, newPage, rotaCli, signIn, waitUntil } from './harness.mjs';

// corp (two API keys) and spare (one), and `smart`: corp's model, then spare's.
const EXTRA = ({ upstream }) => `
[providers.spare]
api = "openai"
base_url = "${upstream.url}/v1"

[virtual_models.smart]
targets = ["corp/gpt-4o-mini", "spare/gpt-4o-mini"]
`;
const K1 = 'corp:k1';
const K2 = 'corp:k2';
const SPARE = 'spare:s';
const VIEWS = ['overview', 'profiles', 'requests', 'chains', 'agents', 'alerts'];

async function addKey(rota, id, secret) {
  const [provider, name] = id.split(':');
  const r = await rota.api('POST', '/api/v1/profiles', { body: { provider, name, secret } });
  assert.equal(r.status, 201, r.text);
}

/** Traffic: 4 chats, one smart request that rotates and falls back, one unknown model. */
async function traffic(env) {
  const { rota, upstream } = env;
  await addKey(rota, K1, 'sk-corp-one');
  await addKey(rota, K2, 'sk-corp-two');
  await addKey(rota, SPARE, 'sk-spare');
  for (let i = 0; i < 4; i += 1) assert.equal((await rota.chat()).status, 200);
  const limited = { status: 429, headers: { 'retry-after': '600' }, body: { error: { message: 'Rate limit reached for requests', type: 'requests', code: 'rate_limit_exceeded' } } };
  await upstream.script({ token_prefix: 'sk-corp', replies: [limited, limited] });
  const smart = await rota.chat({ model: 'smart' });
  assert.equal(smart.status, 200, smart.text);
  assert.equal(smart.headers.get('x-rota-profile'), SPARE);
  const unknown = await rota.chat({ model: 'nope/missing' });
  assert.equal(unknown.status, 404, unknown.text);
  return { smartId: smart.headers.get('x-request-id') };
}

function startWithSpare(options = {}) {
  return { ...options, extraToml: EXTRA, timeoutMs: 240_000 };
}

e2e('console views: overview charts match the API, requests with their attempts, chains verdicts', startWithSpare(), async (t, env) => {
  const { rota } = env;
  await traffic(env);
  const page = await newPage(env.browser, { width: 1440 });
  await signIn(page, rota);

  // -- overview: every chart drawn, its numbers those of the API for the same window -----------
  await page.locator('#tab-overview').click();
  const charts = page.locator('#charts');
  await page.locator('figure[data-chart="share"] canvas').first().waitFor();
  const since = await charts.getAttribute('data-since');
  const until = await charts.getAttribute('data-until');
  const numbers = async (kind) =>
    page.locator(`[data-numbers="${kind}"] tbody tr`).evaluateAll((rows) => rows.map((r) => [r.dataset.key, ...[...r.querySelectorAll('td')].map((td) => td.textContent)]));
  for (const kind of ['requests', 'reasons', 'share', 'timeline', 'attempts']) {
    const fig = page.locator(`figure[data-chart="${kind}"]`).first();
    assert.ok((await fig.locator('canvas').count()) > 0, `${kind}: a chart is drawn`);
  }

  const usage = (await rota.api('GET', `/api/v1/usage?since=${since}&until=${until}`)).json;
  const share = await numbers('share');
  assert.ok(share.length >= 3, `traffic share lists the profiles that served: ${JSON.stringify(share)}`);
  for (const [profile, attempts, successes, failures] of share) {
    const u = usage.profiles.find((p) => p.profile_id === profile);
    assert.ok(u, `${profile} in /api/v1/usage`);
    assert.deepEqual([Number(attempts), Number(successes), Number(failures)], [u.attempts, u.successes, u.failures], `${profile}: share = /api/v1/usage`);
  }
  assert.equal(Number(share.find((r) => r[0] === SPARE)[1]), 1);

  for (const provider of ['corp', 'spare']) {
    const rows = Object.fromEntries((await page.locator(`#strips [data-provider="${provider}"] [data-numbers="attempts"] tbody tr`)
      .evaluateAll((trs) => trs.map((r) => [r.dataset.key, Number(r.querySelector('td').textContent)]))));
    const mine = usage.profiles.filter((p) => p.profile_id.startsWith(`${provider}:`));
    const sum = (f) => mine.reduce((a, p) => a + p[f], 0);
    assert.equal(rows.success, sum('successes'), `${provider}: successes = /api/v1/usage`);
    assert.equal(rows.failure, sum('failures'), `${provider}: failures = /api/v1/usage`);
  }

  const all = (await rota.api('GET', `/api/v1/requests?since=${since}&until=${until}&limit=1000`)).json.items;
  const expect = { served: 0, failed: 0, refused: 0 };
  for (const r of all) expect[r.status >= 200 && r.status < 300 ? 'served' : r.attempts === 0 ? 'refused' : 'failed'] += 1;
  assert.deepEqual(Object.fromEntries((await numbers('requests')).map(([k, v]) => [k, Number(v)])), expect, 'requests chart = /api/v1/requests');
  assert.deepEqual(expect, { served: 5, failed: 0, refused: 1 });

  const reasons = Object.fromEntries((await numbers('reasons')).map(([k, v]) => [k, Number(v)]));
  const limitedApi = (await rota.api('GET', `/api/v1/attempts?since=${since}&until=${until}&reason=rate_limit&outcome=failure`)).json.items.length;
  assert.equal(reasons.rate_limit, limitedApi, 'failures by reason = /api/v1/attempts?reason=rate_limit');
  assert.equal(limitedApi, 2);

  const timeline = await numbers('timeline');
  for (const id of [K1, K2]) {
    const seg = timeline.find((r) => r[0] === id);
    assert.ok(seg && seg[1] === 'cooling' && seg[2] === 'rate_limit', `${id} cooled in the timeline: ${JSON.stringify(timeline)}`);
  }
  const strip = page.locator('#strips [data-provider="corp"]');
  assert.match(await strip.locator('.counts').innerText(), /0 usable · 2 cooling/);
  assert.match(await strip.locator('.back').innerText(), /Next back: corp:k[12] at .* \(in \d+:\d\d\)/);
  await docShot(page, 'overview-1440');

  // -- requests: one row per request, attempts on demand ----------------------------------------
  await page.locator('#tab-requests').click();
  const rows = page.locator('#requests tr.request');
  await waitUntil(async () => (await rows.count()) === 6, { message: 'six requests' });
  assert.match(await page.locator('#view-requests .zone').innerText(), /^Times in .+\.$/);
  const smartRow = page.locator('#requests tr.request', { hasText: 'smart' });
  assert.equal((await smartRow.locator('.attempts').innerText()).trim(), '3');
  assert.match(await smartRow.innerText(), /smart → spare\/gpt-4o-mini/);
  // gpt-4o-mini's list price: 7 tokens in at $0.15/M and 3 out at $0.60/M = 2.85 µ$, stored as 3 µ$.
  assert.equal((await smartRow.locator('.cost').innerText()).trim(), '$0.000003');
  await smartRow.locator('button.expand').click();
  const attempts = page.locator('#requests tr.attempts-of tr.attempt');
  await waitUntil(async () => (await attempts.count()) === 3, { message: 'three attempts under the smart request' });
  const kinds = await attempts.evaluateAll((trs) => trs.map((r) => [r.children[1].textContent, r.children[3].textContent, r.children[4].textContent, r.children[6].textContent]));
  assert.deepEqual(kinds.map((k) => k[0]), ['primary', 'rotate', 'fallback']);
  assert.deepEqual(kinds.map((k) => k[2]), ['failure', 'failure', 'success']);
  assert.deepEqual(kinds.map((k) => k[3]), ['429', '429', '200']);
  assert.equal(kinds[2][1], SPARE);
  assert.match(await page.locator('#requests tr.attempts-of').innerText(), /Rate limit reached/);

  const refused = page.locator('#requests tr.request[data-outcome="refused"]');
  assert.equal(await refused.count(), 1, 'the unknown-model request is listed');
  assert.match(await refused.innerText(), /nope\/missing[\s\S]*404 refused/);
  assert.equal((await refused.locator('.cost').innerText()).trim(), '—', 'nothing served, no cost');
  await refused.locator('button.expand').click();
  assert.match(await page.locator('#requests tr.attempts-of .request-error').last().innerText(), /404.*nope/);
  await docShot(page, 'requests-1440');

  // Dropdown filters: every reason is one the API takes; rate_limit finds the smart request.
  const reasonsOffered = await page.locator('#filter-reason option').evaluateAll((os) => os.map((o) => o.value).filter(Boolean));
  assert.equal(reasonsOffered.length, 15);
  for (const reason of reasonsOffered) {
    const r = await rota.api('GET', `/api/v1/requests?reason=${reason}&limit=1`);
    assert.equal(r.status, 200, `reason ${reason}: ${r.text}`);
  }
  await page.locator('#filter-reason').selectOption('rate_limit');
  await page.locator('#filter-apply').click();
  await waitUntil(async () => (await rows.count()) === 1, { message: 'one request with a rate_limit attempt' });
  assert.match(await rows.first().innerText(), /smart/);
  await page.locator('#filter-reason').selectOption('');
  await page.locator('#filter-profile').selectOption(SPARE);
  await page.locator('#filter-apply').click();
  await waitUntil(async () => (await rows.count()) === 1, { message: 'one request served by spare' });

  // A filter the API refuses (a value from a stale page): no rows left under it, the reason said.
  await page.locator('#filter-reason').evaluate((s) => s.append(new Option('bogus', 'bogus')));
  await page.locator('#filter-reason').selectOption('bogus');
  await page.locator('#filter-apply').click();
  const refusal = page.locator('#view-requests .notice[data-kind="error"]');
  await refusal.waitFor();
  assert.match(await refusal.innerText(), /bogus/);
  assert.equal(await rows.count(), 0, 'no stale rows under the refused filter');
  await page.locator('#filter-reason').selectOption('');
  await page.locator('#filter-profile').selectOption('');
  await page.locator('#filter-apply').click();
  await waitUntil(async () => (await rows.count()) === 6, { message: 'all six again' });
  assert.equal(await refusal.count(), 0, 'the refusal goes once a filter is taken');

  // -- chains: a verdict each, countdowns that tick -----------------------------------------------
  await page.locator('#tab-chains').click();
  const smartCard = page.locator('.chain[data-model="smart"]');
  await smartCard.waitFor();
  assert.match(await smartCard.locator('.verdict').innerText(), /next request goes to spare\/gpt-4o-mini via spare:s/);
  const opsCard = page.locator('#chains .chain').first();
  assert.match(await opsCard.locator('.verdict').innerText(), /Nothing usable until .* \(in \d+:\d\d\)/);
  const before = await smartCard.locator('li[data-profile="corp:k1"] .state').innerText();
  await page.waitForTimeout(2_100);
  const after = await smartCard.locator('li[data-profile="corp:k1"] .state').innerText();
  assert.notEqual(before, after, `the countdown ticks: "${before}" then "${after}"`);
  await docShot(page, 'chains-1440');

  // Pages of 50: "Older requests" goes on with the same filters, twice, to the end.
  for (let i = 0; i < 100; i += 10) {
    await Promise.all(Array.from({ length: 10 }, () => rota.chat({ model: 'spare/gpt-4o-mini' })));
  }
  await page.locator('#tab-requests').click();
  await page.locator('#filter-profile').selectOption(SPARE);
  await page.locator('#filter-apply').click();
  await waitUntil(async () => (await rows.count()) === 50, { message: 'the first page of spare\'s requests' });
  await page.locator('#requests-more').click();
  await waitUntil(async () => (await rows.count()) === 100, { message: 'the second page' });
  await page.locator('#requests-more').click();
  await waitUntil(async () => (await rows.count()) === 101, { message: 'the last page: the smart request too' });
  assert.equal(await page.locator('#requests-more').isVisible(), false, 'no page after the last');
  const ids = await rows.evaluateAll((trs) => trs.map((r) => r.dataset.request));
  assert.equal(new Set(ids).size, 101, 'no request twice');
});

e2e('console profiles: engine order, next, fixed order and back, tokens with expiry; agents page', startWithSpare(), async (t, env) => {
  const { rota } = env;
  for (const [id, secret] of [[K1, 'sk-corp-one'], [K2, 'sk-corp-two'], ['corp:k3', 'sk-corp-three']]) await addKey(rota, id, secret);
  // k1 serves twice and k2 once: least recently used first puts k3, then k1, then k2... as the engine says.
  for (let i = 0; i < 3; i += 1) assert.equal((await rota.chat()).status, 200);
  const page = await newPage(env.browser, { width: 1440 });
  await signIn(page, rota);
  await page.locator('#tab-profiles').click();
  const corp = page.locator('#providers section[data-provider="corp"]');
  const shown = () => corp.locator('tr[data-profile]').evaluateAll((rows) => rows.map((r) => r.dataset.profile));
  const engine = async () => (await rota.api('GET', '/api/v1/providers')).json.find((p) => p.name === 'corp');
  await corp.locator('tr[data-profile]').first().waitFor();
  let e = await engine();
  assert.deepEqual(await shown(), e.rotation, 'rows in the engine\'s order');
  assert.equal(await corp.locator(`tr[data-profile="${e.next}"] .badge.next`).count(), 1, 'next is marked');
  const served = await rota.chat();
  assert.equal(served.headers.get('x-rota-profile'), e.next, 'the request went to the profile marked next');
  // The CLI, reading the database, tells the same order (once the stats are written behind);
  // the one just used is now last, so this is not the order of the ids.
  e = await engine();
  assert.notDeepEqual(e.rotation, [...e.rotation].sort());
  const cli = () => JSON.parse(rotaCli(env.dir, ['profiles', 'list', '--json'])).filter((p) => p.provider === 'corp');
  await waitUntil(async () => JSON.stringify(cli().map((p) => p.id)) === JSON.stringify(e.rotation), { message: 'rota profiles list --json in the same order' });
  assert.deepEqual(cli().map((p) => [p.position, p.next]), e.rotation.map((id, i) => [i + 1, id === e.next]));

  // ↑ fixes the order; "Back to least recently used" undoes it.
  await page.reload();
  await page.locator('#tab-profiles').click();
  await corp.locator('tr[data-profile]').first().waitFor();
  e = await engine();
  const second = e.rotation[1];
  const up = corp.locator(`tr[data-profile="${second}"] [data-action="up"]`);
  assert.match(await up.getAttribute('aria-label'), /fixes the order/);
  await up.click();
  await waitUntil(async () => (await engine()).order_source === 'stored', { message: 'a stored order' });
  await corp.locator('[data-action="reset-order"]').waitFor();
  assert.equal((await shown())[0], second);
  await corp.locator('[data-action="reset-order"]').click();
  await waitUntil(async () => (await engine()).order_source === 'round_robin', { message: 'back to least recently used' });
  await waitUntil(async () => (await corp.locator('[data-action="reset-order"]').count()) === 0, { message: 'the reset link goes' });

  // A token with an expiry.
  await corp.locator('.actions [data-action="add-key"]').click();
  await corp.locator('#key-type').selectOption('token');
  await corp.locator('#key-name').fill('tok');
  await corp.locator('#key-secret').fill('tok-secret-value');
  const inThreeDays = new Date(Date.now() + 3 * 86_400_000 + 3_600_000);
  const local = new Date(inThreeDays.getTime() - inThreeDays.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
  await corp.locator('#key-expires').fill(local);
  await corp.locator('#key-submit').click();
  const tok = corp.locator('tr[data-profile="corp:tok"]');
  await tok.waitFor();
  assert.equal((await tok.locator('.type').innerText()).trim(), 'token');
  assert.equal((await tok.locator('.expires').innerText()).trim(), 'in 3 days');
  const api = (await rota.profiles()).find((p) => p.id === 'corp:tok');
  assert.ok(Math.abs(Date.parse(api.expires_at) - inThreeDays.getTime()) < 60_000, `expires_at ${api.expires_at}`);
  assert.ok(!(await page.content()).includes('tok-secret-value'), 'the secret is not in the page');

  // A service principal (client_credentials): its client id and secret, which rota exchanges at
  // the IdP for an access token and calls with; the secret never reaches a page or the upstream.
  await corp.locator('.actions [data-action="add-key"]').click();
  await corp.locator('#key-type').selectOption('client_credentials');
  assert.equal((await corp.locator('label[for="key-name"]').innerText()).trim(), 'Client ID');
  await corp.locator('#key-name').fill('svc-app');
  await corp.locator('#key-secret').fill('svc-app-secret-0001');
  await corp.locator('#key-submit').click();
  const svc = corp.locator('tr[data-profile="corp:svc-app"]');
  await svc.waitFor();
  assert.equal((await svc.locator('.type').innerText()).trim(), 'client_credentials');
  const viaSvc = await rota.api('POST', '/v1/chat/completions', {
    body: { model: 'corp/gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] },
    headers: { 'x-rota-profile': 'corp:svc-app' },
  });
  assert.equal(viaSvc.status, 200, viaSvc.text);
  const granted = (await env.idp.issued()).filter((i) => i.grant_type === 'client_credentials');
  assert.equal(granted.length, 1, 'one exchange at the IdP');
  assert.equal((await env.upstream.seen()).at(-1).authorization, `Bearer ${granted[0].access_token}`);
  assert.ok(!(await page.content()).includes('svc-app-secret-0001'), 'the client secret is not in the page');

  // A Google service account: its JSON key uploaded, the profile named after its client_email;
  // rota signs an assertion with the key and the (fake) token endpoint verifies it.
  const pem = readFileSync(new URL('../fixtures/service-accounts/a.pem', import.meta.url), 'utf8');
  const email = 'rota-browser@acme-ml.iam.gserviceaccount.com';
  const saKey = JSON.stringify({ type: 'service_account', project_id: 'acme-ml', private_key_id: 'k1', private_key: pem, client_email: email, token_uri: `${env.upstream.url}/token` });
  await corp.locator('.actions [data-action="add-key"]').click();
  await corp.locator('#key-type').selectOption('service_account');
  await corp.locator('#key-file').setInputFiles({ name: 'acme-ml-key.json', mimeType: 'application/json', buffer: Buffer.from(saKey) });
  await waitUntil(async () => (await corp.locator('#key-name').inputValue()) === email, { message: 'named from the key' });
  await corp.locator('#key-submit').click();
  const sa = corp.locator(`tr[data-profile="corp:${email}"]`);
  await sa.waitFor();
  assert.equal((await sa.locator('.type').innerText()).trim(), 'service_account');
  const viaSa = await rota.api('POST', '/v1/chat/completions', {
    body: { model: 'corp/gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] },
    headers: { 'x-rota-profile': `corp:${email}` },
  });
  assert.equal(viaSa.status, 200, viaSa.text);
  const saTokens = await (await fetch(`${env.upstream.url}/__issued`)).json();
  assert.equal(saTokens.length, 1, 'one verified assertion');
  assert.equal((await env.upstream.seen()).at(-1).authorization, `Bearer ${saTokens[0]}`);
  assert.ok(!(await page.content()).includes('PRIVATE KEY'), 'the key is not in the page');

  // Rotate before the 429: an answer saying no request is left puts its profile last until
  // the reset, and the row shows what is left.
  const completion = { id: 'c', object: 'chat.completion', model: 'gpt-4o-mini', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] };
  const headers = { 'x-ratelimit-limit-requests': '3', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '5m', 'x-ratelimit-remaining-tokens': '9000', 'x-codex-primary-used-percent': '37.5' };
  await env.upstream.script({ replies: [{ status: 200, headers, body: completion }] });
  const spent = (await rota.chat()).headers.get('x-rota-profile');
  await waitUntil(async () => (await engine()).rotation.at(-1) === spent, { message: `${spent} goes last` });
  await page.reload();
  await page.locator('#tab-profiles').click();
  const quota = corp.locator(`tr[data-profile="${spent}"] .quota`);
  await quota.waitFor();
  assert.match(await quota.innerText(), /^0\/3 req · 9000 tok · 62% of plan/);
  assert.equal(await quota.locator('.badge.low').count(), 1, 'marked last until the reset');
  assert.match(await quota.getAttribute('title'), /resets in [45]:\d\d/);
  assert.equal(await corp.locator('tr[data-profile] .badge.low').count(), 1, 'only the profile that ran out');

  // A disabled row: Enable is its primary action, inside the card.
  await corp.locator('tr[data-profile="corp:k3"] [data-action="disable"]').click();
  await waitUntil(async () => (await corp.locator('tr[data-profile="corp:k3"] [data-action="enable"].primary').count()) === 1, { message: 'Enable is primary' });
  await docShot(page, 'profiles-1440');

  // -- agents: create (key once, copy), use, revoke ----------------------------------------------
  await page.locator('#tab-agents').click();
  await page.locator('#agents tr[data-agent="ops"]').waitFor();
  await page.locator('#agent-name').fill('bad name!');
  await page.locator('#agent-create').click();
  const error = page.locator('#view-agents .notice[data-kind="error"]');
  await error.waitFor();
  assert.match(await error.innerText(), /invalid/);
  await page.locator('#tab-profiles').click();
  assert.equal(await page.locator('.notice[data-kind="error"]:visible').count(), 0, 'the agents tab\'s error stays in its tab');
  await page.locator('#tab-agents').click();
  await error.locator('.dismiss').click();
  assert.equal(await error.count(), 0, 'dismissed');

  await page.locator('#agent-name').fill('bot');
  await page.locator('#agent-create').click();
  const key = (await page.locator('#new-key').innerText()).trim();
  assert.match(key, /^rk_/);
  assert.equal(await page.locator('#copy-key').count(), 1);
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write']);
  await page.locator('#copy-key').click();
  await waitUntil(async () => (await page.locator('#copy-key').innerText()) === 'Copied', { message: 'copied' });
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), key);
  const bot = page.locator('#agents tr[data-agent="bot"]');
  await bot.waitFor();
  assert.match(await bot.innerText(), /agent[\s\S]*active/);
  assert.equal((await rota.chat({ key })).status, 200, 'the new key works');
  // Limits set through the admin API: the row shows the use against each. (The minute is the
  // clock's: not in its last ten seconds, so the three requests and the view share it.)
  const inMinute = new Date().getUTCSeconds();
  if (inMinute >= 50) await new Promise((resolve) => setTimeout(resolve, (61 - inMinute) * 1000));
  const limited = await rota.api('PATCH', '/api/v1/agents/bot', { body: { requests_per_minute: 2, tokens_per_day: 100000 } });
  assert.equal(limited.status, 200, limited.text);
  for (let i = 0; i < 2; i += 1) assert.equal((await rota.chat({ key })).status, 200);
  const over = await rota.chat({ key });
  assert.equal(over.status, 429, over.text);
  assert.ok(Number(over.headers.get('retry-after')) >= 1);
  assert.match(over.text, /agent bot is over its limit requests_per_minute = 2/);
  await page.locator('#tab-profiles').click();
  await page.locator('#tab-agents').click();
  const rpm = bot.locator('li[data-limit="requests_per_minute"]');
  await waitUntil(async () => (await rpm.count()) === 1 && (await rpm.innerText()).includes('2 / 2 requests this minute'), { message: 'the use against the limit' });
  assert.equal(await rpm.getAttribute('data-state'), 'over');
  assert.equal(await rpm.locator('meter').getAttribute('aria-label'), 'bot: 2 / 2 requests this minute');
  assert.match(await bot.locator('li[data-limit="tokens_per_day"]').innerText(), /\/ 100000 tokens today/);
  await bot.locator('[data-action="revoke"]').click();
  await waitUntil(async () => (await bot.getAttribute('data-revoked')) === 'true', { message: 'bot revoked' });
  await page.locator('#agent-key button.link').click();
  assert.equal(await page.locator('#new-key').count(), 0, 'the key is gone from the page once done');
  await docShot(page, 'agents-1440');
  assert.equal((await rota.chat({ key })).status, 401, 'the revoked key is refused');
  const listed = (await rota.api('GET', '/api/v1/agents')).json.find((a) => a.name === 'bot');
  assert.ok(listed.revoked_at && !listed.admin);
});

e2e('console at 1440 and 390 px: buttons inside their cards, state first on phones, no serious axe violations', startWithSpare(), async (t, env) => {
  const { rota } = env;
  await traffic(env);
  await rota.api('POST', `/api/v1/profiles/${encodeURIComponent(SPARE)}/disable`);
  // The agents view with limits and their meters, scanned too.
  const limited = await rota.api('PATCH', '/api/v1/agents/ops', { body: { requests_per_minute: 1000, tokens_per_day: 1000000, cost_per_day: 25 } });
  assert.equal(limited.status, 200, limited.text);
  for (const width of [1440, 390]) {
    const page = await newPage(env.browser, { width, height: 900, bypassCSP: true });
    await signIn(page, rota);
    // The tabs are WAI-ARIA tabs: the arrow keys move between them.
    await page.locator('#tab-overview').click();
    await page.keyboard.press('ArrowRight');
    assert.equal(await page.locator('#tab-profiles').getAttribute('aria-selected'), 'true');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'tab-profiles');
    assert.equal(await page.locator('#view-profiles').isVisible(), true);
    for (const view of VIEWS) {
      await page.locator(`#tab-${view}`).click();
      await page.locator(`#view-${view}`).waitFor();
      if (view === 'overview') await page.locator('figure[data-chart="share"] canvas').first().waitFor();
      if (view === 'profiles') await page.locator('#providers tr[data-profile]').first().waitFor();
      if (view === 'requests') await page.locator('#requests tr.request').first().waitFor();
      if (view === 'chains') await page.locator('#chains .chain').first().waitFor();
      if (view === 'agents') await page.locator('#agents tr[data-agent] li[data-limit] meter').first().waitFor();
      if (view === 'alerts') await page.locator('#alert-rules tbody tr').first().waitFor();
      await page.waitForTimeout(300);
      const wide = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(wide <= width, `${view} at ${width} px: the page is ${wide} px wide`);
      const violations = await axeScan(page);
      assert.deepEqual(violations, [], `${view} at ${width} px: axe-core`);
      if (width === 390) await docShot(page, `${view}-390`);
    }
    // Every row's buttons inside its card.
    await page.locator('#tab-profiles').click();
    await page.locator('#providers tr[data-profile]').first().waitFor();
    const outside = await page.evaluate(() => {
      const bad = [];
      for (const card of document.querySelectorAll('#providers section.card')) {
        const c = card.getBoundingClientRect();
        for (const b of card.querySelectorAll('tr[data-profile] button')) {
          const r = b.getBoundingClientRect();
          if (r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 || r.bottom > c.bottom + 0.5) {
            bad.push(`${b.closest('tr').dataset.profile} ${b.textContent}: [${r.left}, ${r.right}] outside [${c.left}, ${c.right}]`);
          }
        }
      }
      return bad;
    });
    assert.deepEqual(outside, [], `buttons outside their card at ${width} px`);
    if (width === 390) {
      // Stacked cards: the state comes first in each row and is on screen.
      const firsts = await page.locator('#providers tr[data-profile]').evaluateAll((rows) => rows.map((r) => {
        const cells = [...r.children].filter((c) => getComputedStyle(c).display !== 'none');
        const top = Math.min(...cells.map((c) => c.getBoundingClientRect().top));
        const state = r.querySelector('.state-cell').getBoundingClientRect();
        return { first: state.top <= top + 0.5, visible: state.right <= window.innerWidth };
      }));
      assert.ok(firsts.every((f) => f.first && f.visible), `state first and visible on every row: ${JSON.stringify(firsts)}`);
    }
  }
});
