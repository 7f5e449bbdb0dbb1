// Token refresh against the real IdP, through the API (the browser only logs the account in):
// one refresh for a burst of concurrent requests, a revoked refresh token disabling the profile
// with "needs re-login", and two rota processes on one database rotating the same refresh token.
//
// Timing: the IdP's access tokens live accessTtl seconds; rota refreshes `lead` before expiry.
// Each test waits on the wall clock for the token to enter the lead window (the IdP's clock and
// rota's are the machine's), so each takes 15-30 s.

import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { apiLogin, e2e, freePort, newPage, rotaToml, shot, signIn, sleepUntil, startRota, waitUntil } from './harness.mjs';

const ALICE = 'corp:alice@example.com';

e2e('50 concurrent requests inside the lead window: exactly one refresh, then the new token', { timeoutMs: 120_000, accessTtl: 20, lead: '10s' }, async (t, env) => {
  const { rota, idp, upstream } = env;
  await apiLogin(env, 'alice');
  const login = await idp.latest('alice');
  assert.equal(login.grant_type, 'authorization_code');
  assert.equal(login.expires_in, 20);
  const before = await idp.stats();
  assert.equal(before.refresh_grants, 0, 'no refresh right after the login (the token is outside the lead window)');

  // Expiry at login.at + 20 s, lead 10 s: inside the window from login.at + 10 s.
  await sleepUntil(login.at + 11_500);
  await upstream.clearSeen();
  const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => rota.chat({ content: `burst ${i}` })));
  assert.deepEqual(answers.map((a) => a.status), Array(50).fill(200), answers.find((a) => a.status !== 200)?.text);
  assert.ok(answers.every((a) => a.headers.get('x-rota-profile') === ALICE));

  const after = await idp.stats();
  assert.equal(after.refresh_grants - before.refresh_grants, 1, `exactly one refresh for the burst; IdP failures: ${JSON.stringify(after.failures)}`);
  assert.equal(after.failures['refresh_token invalid_grant'] ?? 0, 0, 'no refresh was refused');
  const refreshed = await idp.latest('alice');
  assert.equal(refreshed.grant_type, 'refresh_token');
  assert.notEqual(refreshed.access_token, login.access_token);

  const seen = await upstream.seen();
  assert.equal(seen.length, 50);
  const allowed = new Set([`Bearer ${login.access_token}`, `Bearer ${refreshed.access_token}`]);
  assert.ok(seen.every((s) => allowed.has(s.authorization)), 'only the login token or the refreshed one went upstream');
  assert.ok(seen.some((s) => s.authorization === `Bearer ${refreshed.access_token}`), 'the burst used the refreshed token');

  // Afterwards, the new token (still outside its own lead window: it expires 20 s after the refresh).
  const next = await rota.chat();
  assert.equal(next.status, 200);
  assert.equal((await upstream.seen()).at(-1).authorization, `Bearer ${refreshed.access_token}`);
  assert.equal((await idp.stats()).refresh_grants - before.refresh_grants, 1, 'still one refresh');
});

e2e('a revoked refresh token disables the profile: auth_permanent, "needs re-login"', { timeoutMs: 120_000, accessTtl: 20, lead: '10s' }, async (t, env) => {
  const { rota, idp } = env;
  await apiLogin(env, 'alice');
  const login = await idp.latest('alice');
  const { revoked } = await idp.revoke('alice');
  assert.ok(revoked >= 1, 'the IdP revoked alice');

  await sleepUntil(login.at + 11_000);
  // A request inside the lead window makes rota refresh (if its background refresher has not yet).
  const r = await rota.chat();
  t.diagnostic(`gateway answer during the failed refresh: ${r.status}`);

  const p = await rota.waitProfile(ALICE, (x) => x.status.state === 'disabled', 20_000);
  assert.equal(p.status.reason, 'auth_permanent');
  assert.match(p.status_text, /needs re-login/);
  const stats = await idp.stats();
  assert.equal(stats.refresh_grants, 0);
  assert.ok((stats.failures['refresh_token invalid_grant'] ?? 0) >= 1, `rota's refresh was refused: ${JSON.stringify(stats.failures)}`);

  // The console says so too.
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const state = page.locator(`tr[data-profile="${ALICE}"] .state`);
  await state.waitFor();
  assert.equal(await state.getAttribute('data-state'), 'disabled');
  assert.match(await state.innerText(), /needs re-login/);
  assert.equal(await page.locator(`tr[data-profile="${ALICE}"] [data-action="relogin"].primary`).count(), 1, 'Re-login is the row\'s primary action');
  await shot(page, 'refresh-needs-relogin');
});

// Two `rota serve` on one rota.db (same dir, so the same key file): B refreshes first and rotates
// the refresh token at the IdP; then A, still holding the spent one, must end up on B's tokens
// and keep serving, not disable the account.
//
// The IdP runs with reuse detection on (oidc-provider's default, and many real IdPs'): presenting
// the spent refresh token would revoke the whole grant, B's new tokens included. A keeps the
// account alive only by re-reading the database *before* it refreshes, which the last check
// confirms: A never presented the spent token.
e2e('sibling rota processes: a refresh token rotated by one is picked up by the other', { timeoutMs: 150_000, accessTtl: 30, lead: '5s' }, async (t, env) => {
  const { rota: a, idp, upstream, dir } = env;
  await apiLogin(env, 'alice');
  const login = await idp.latest('alice'); // expires at login.at + 30 s
  const before = await idp.stats();

  // B: same database and key file, a 20 s lead (its window opens at login.at + 10 s; A's at + 25 s).
  writeFileSync(join(dir, 'rota-b.toml'), rotaToml({ dir, idp, upstream, lead: '20s' }));
  const b = await startRota({ dir, port: await freePort(), adminKey: a.adminKey, config: 'rota-b.toml', name: 'rota-b' });
  env.children.push(b);
  assert.equal((await b.profile(ALICE))?.type, 'oauth', 'B reads the profile from the shared database');

  await sleepUntil(login.at + 11_000);
  const rb = await b.chat();
  assert.equal(rb.status, 200, rb.text);
  await waitUntil(async () => (await idp.stats()).refresh_grants - before.refresh_grants === 1, { message: 'B refreshed', deadlineMs: 10_000 });
  const fromB = await idp.latest('alice');
  assert.equal(fromB.grant_type, 'refresh_token');
  assert.equal((await upstream.seen()).at(-1).authorization, `Bearer ${fromB.access_token}`, 'B served with its new token');
  await b.stop(); // no further refreshes from B

  // A's window: A holds the login tokens in memory; the refresh token is spent at the IdP.
  await sleepUntil(login.at + 26_000);
  await upstream.clearSeen();
  const ra = await a.chat();
  assert.equal(ra.status, 200, ra.text);
  const seen = await upstream.seen();
  assert.equal(seen.length, 1);
  assert.equal(seen[0].authorization, `Bearer ${fromB.access_token}`, "A served with B's refreshed access token");
  const p = await a.profile(ALICE);
  assert.notEqual(p.status.state, 'disabled', `A kept the profile: ${JSON.stringify(p.status)} ${p.status_text}`);
  assert.equal(p.status.state, 'usable');
  const stats = await idp.stats();
  assert.equal(stats.refresh_grants - before.refresh_grants, 1, 'only B refreshed successfully');
  const stale = (stats.failures['refresh_token invalid_grant'] ?? 0) - (before.failures['refresh_token invalid_grant'] ?? 0);
  await t.test('A never presents the spent refresh token', () => {
    assert.equal(stale, 0, `A presented the refresh token B had rotated (${stale}x) before re-reading the database; `
      + 'an IdP with reuse detection (oidc-provider by default) then revokes the whole grant, B\'s new tokens included, '
      + 'and the account needs a re-login at its next refresh');
  });
});
