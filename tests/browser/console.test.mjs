// The web console end to end: sign in with the admin key, log two accounts in through the IdP's
// real login and consent pages, watch gateway traffic reach the upstream with their tokens, a
// rate-limit cooldown count down, then clear, reorder, disable and delete from the console.

import assert from 'node:assert/strict';

import { e2e, idpLogin, newPage, shot, waitUntil } from './harness.mjs';

const ALICE = 'corp:alice@example.com';
const BOB = 'corp:bob@example.com';

/** "cooling 0:29 · rate_limit" -> 29 (seconds); undefined without a m:ss countdown. */
function countdown(text) {
  const m = /(\d+):(\d{2})/.exec(text);
  return m ? Number(m[1]) * 60 + Number(m[2]) : undefined;
}

e2e('console: accounts, traffic, cooldown, clear, reorder, disable, delete', { timeoutMs: 180_000 }, async (t, env) => {
  const { rota, idp, upstream } = env;
  const page = await newPage(env.browser);
  const row = (id) => page.locator(`tr[data-profile="${id}"]`);
  const corp = page.locator('section[data-provider="corp"]');

  // -- sign in --------------------------------------------------------------------------------
  await page.goto(`${rota.url}/ui/`);
  await page.locator('#admin-key').waitFor();
  assert.equal(await page.locator('a#sso').isVisible(), false, 'no SSO button without [console.sso]');
  await shot(page, 'console-sign-in');
  assert.equal(await page.locator('#tab-profiles').count(), 0, 'no console before signing in');
  await page.locator('#admin-key').fill(rota.adminKey);
  await page.locator('#sign-in').click();
  await page.locator('#tab-profiles').waitFor();
  assert.equal(await page.locator('#admin-key').isVisible(), false, 'the sign-in form is gone');
  await page.locator('body[data-ready="true"]').waitFor({ state: 'attached' });
  await page.locator('#tab-profiles').click();

  // -- two accounts through the IdP's pages ---------------------------------------------------
  for (const login of ['alice', 'bob']) {
    const id = `corp:${login}@example.com`;
    await corp.locator('[data-action="add-account"]').click();
    await page.waitForURL((u) => u.href.startsWith(`${idp.issuer}/`));
    assert.deepEqual(await idpLogin(page, idp, login), ['login', 'consent'], `${login}: the IdP's login and consent pages`);
    await page.waitForURL((u) => u.href.startsWith(`${rota.url}/ui/`));
    // The console says who logged in, from `?added=`, then drops it from the address (how soon
    // depends on its first API answers, so the address itself is no witness).
    await page.locator('#view-profiles .notice', { hasText: `Logged in ${id}` }).waitFor();
    assert.equal(new URL(page.url()).search, '', 'the address no longer carries ?added=');
    await row(id).waitFor();
    assert.equal((await row(id).locator('.type').innerText()).trim(), 'oauth');
    assert.equal((await row(id).locator('.email').innerText()).trim(), `${login}@example.com`);
    assert.equal(await row(id).locator('.state').getAttribute('data-state'), 'usable');
  }
  const profiles = await rota.profiles();
  for (const id of [ALICE, BOB]) {
    const p = profiles.find((x) => x.id === id);
    assert.ok(p, `${id} in GET /api/v1/profiles`);
    assert.equal(p.type, 'oauth');
    assert.equal(p.provider, 'corp');
    assert.equal(p.email, id.slice('corp:'.length));
    assert.equal(p.status.state, 'usable');
  }
  assert.equal((await idp.stats()).code_grants, 2, 'one code exchange per account');
  await shot(page, 'console-profiles');

  // -- gateway traffic carries each account's access token --------------------------------------
  const tokenOf = {
    [`Bearer ${(await idp.latest('alice')).access_token}`]: ALICE,
    [`Bearer ${(await idp.latest('bob')).access_token}`]: BOB,
  };
  await upstream.clearSeen();
  const served = [];
  for (let i = 0; i < 4; i += 1) {
    const r = await rota.chat();
    assert.equal(r.status, 200, r.text);
    served.push(r.headers.get('x-rota-profile'));
  }
  const seen = await upstream.seen();
  assert.equal(seen.length, 4);
  assert.deepEqual(seen.map((s) => tokenOf[s.authorization]), served, 'each call used the access token of the profile rota named');
  assert.deepEqual(new Set(served), new Set([ALICE, BOB]), 'both accounts served');
  assert.ok(seen.every((s) => s.model === 'gpt-4o-mini'));

  // -- a 429 with retry-after 30: a countdown in the row ------------------------------------------
  await upstream.clearSeen();
  await upstream.script({
    replies: [{ status: 429, headers: { 'retry-after': '30' }, body: { error: { message: 'Rate limit reached for requests', type: 'requests', code: 'rate_limit_exceeded' } } }],
  });
  const failover = await rota.chat();
  assert.equal(failover.status, 200, failover.text);
  const [limited, ok] = await upstream.seen();
  assert.equal(limited.status, 429);
  assert.equal(ok.status, 200);
  const cooled = tokenOf[limited.authorization];
  const other = cooled === ALICE ? BOB : ALICE;
  assert.equal(failover.headers.get('x-rota-profile'), other, 'failed over to the other account');
  assert.equal(tokenOf[ok.authorization], other);

  const api = await rota.profile(cooled);
  assert.equal(api.status.state, 'cooling');
  assert.equal(api.status.reason, 'rate_limit');
  const left = api.status.until - Date.now();
  assert.ok(left > 20_000 && left <= 31_000, `cooling until ~30 s from now, got ${left} ms`);

  const state = row(cooled).locator('.state');
  await waitUntil(async () => (await state.getAttribute('data-state')) === 'cooling', { message: `${cooled} row shows cooling` });
  const first = await state.innerText();
  assert.match(await state.getAttribute('data-detail'), /rate_limit/);
  await page.waitForTimeout(2_100);
  const second = await state.innerText();
  const [a, b] = [countdown(first), countdown(second)];
  assert.ok(a !== undefined && b !== undefined, `a m:ss countdown in "${first}" and "${second}"`);
  assert.ok(a <= 30 && a >= 20, `countdown starts near 0:30: "${first}"`);
  assert.ok(b < a, `the countdown decreases: "${first}" then "${second}"`);
  await shot(page, 'console-cooling');

  // -- clear ------------------------------------------------------------------------------------
  await row(cooled).locator('[data-action="clear"]').click();
  await waitUntil(async () => (await state.getAttribute('data-state')) === 'usable', { message: `${cooled} usable after Clear` });
  assert.equal((await rota.profile(cooled)).status.state, 'usable');

  // -- requests and chains tabs -------------------------------------------------------------------
  await page.locator('#tab-requests').click();
  const requestRows = page.locator('#requests tr.request');
  // 4 calls with one attempt each, then one call with two (429, then the other account).
  await waitUntil(async () => {
    await page.locator('#filter-apply').click();
    return (await requestRows.count()) === 5;
  }, { message: 'five rows in the requests log', intervalMs: 500 });
  await shot(page, 'console-requests');
  await page.locator('#filter-reason').selectOption('rate_limit');
  await page.locator('#filter-apply').click();
  await waitUntil(async () => (await requestRows.count()) === 1, { message: 'one request with a rate_limit attempt' });
  assert.match(await requestRows.first().innerText(), new RegExp(other.replace(/[.]/g, '\\.')), 'served by the other account');
  assert.equal((await requestRows.first().locator('.attempts').innerText()).trim(), '2');
  await page.locator('#filter-reason').selectOption('');
  await page.locator('#filter-profile').selectOption(other);
  await page.locator('#filter-apply').click();
  const otherCount = served.filter((s) => s === other).length + 1; // + the failover success
  await waitUntil(async () => (await requestRows.count()) === otherCount, { message: `${otherCount} requests with an attempt of ${other}` });

  await page.locator('#tab-chains').click();
  const chains = page.locator('#chains');
  await chains.waitFor();
  const chainText = await chains.innerText();
  // ops has no [agents.ops] section: its chain is the default one, which the console may show
  // under the agent's name or as the default that every agent without a section uses.
  assert.match(chainText, /\bops\b|default/);
  assert.match(chainText, /corp\/gpt-4o-mini/);
  await shot(page, 'console-chains');

  // -- reorder: the second row up ---------------------------------------------------------------
  await page.locator('#tab-profiles').click();
  const order = async () => corp.locator('tr[data-profile]').evaluateAll((rows) => rows.map((r) => r.dataset.profile));
  const rotation = (await rota.api('GET', '/api/v1/providers')).json.find((p) => p.name === 'corp').rotation;
  await waitUntil(async () => JSON.stringify(await order()) === JSON.stringify(rotation), { message: `rows in rotation order ${rotation}` });
  const [firstId, secondId] = rotation;
  await row(secondId).locator('[data-action="up"]').click();
  await waitUntil(async () => {
    const providers = (await rota.api('GET', '/api/v1/providers')).json;
    const c = providers.find((p) => p.name === 'corp');
    return c.order.length === 2 && c.order[0] === secondId && c.order[1] === firstId && c.order_source === 'stored';
  }, { message: `corp order [${secondId}, ${firstId}] in GET /api/v1/providers` });
  await waitUntil(async () => JSON.stringify(await order()) === JSON.stringify([secondId, firstId]), { message: `${secondId} listed first` });

  // -- disable bob: only alice serves -----------------------------------------------------------
  await row(BOB).locator('[data-action="disable"]').click();
  const bobState = row(BOB).locator('.state');
  // An admin's "off" is not the disabled lane (billing, auth_permanent): the API calls it
  // unusable ("disabled by an admin"); either state name will do, the words must say disabled.
  await waitUntil(async () => ['disabled', 'unusable'].includes(await bobState.getAttribute('data-state')), { message: 'bob disabled' });
  assert.match(await bobState.innerText(), /disabled/);
  const bobApi = await rota.profile(BOB);
  assert.equal(bobApi.enabled, false);
  assert.notEqual(bobApi.status.state, 'usable');
  const afterDisable = await rota.chat();
  assert.equal(afterDisable.status, 200);
  assert.equal(afterDisable.headers.get('x-rota-profile'), ALICE);

  // -- delete bob (confirm() is accepted) ---------------------------------------------------------
  await row(BOB).locator('[data-action="delete"]').click();
  await row(BOB).waitFor({ state: 'detached' });
  assert.equal((await rota.api('GET', `/api/v1/profiles/${encodeURIComponent(BOB)}`)).status, 404);
  assert.equal(await row(ALICE).count(), 1, 'alice stays');
  const corpAfter = (await rota.api('GET', '/api/v1/providers')).json.find((p) => p.name === 'corp');
  assert.ok(!corpAfter.profiles.includes(BOB) && !corpAfter.order.includes(BOB), 'bob is gone from the provider and its order');
});
