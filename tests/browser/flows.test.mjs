// The other ways to log an account in from the console: the paste-URL flow (the redirect goes to
// http://localhost:1455/auth/callback, where nothing listens, and the user pastes that URL back),
// with forged pastes refused; the device flow (user code on the IdP's page); and the redirect
// flow with the IdP on another site than rota, as it is outside tests.

import assert from 'node:assert/strict';

import { PASTE_REDIRECT, capturePasteRedirect, e2e, idpLogin, newPage, randomToken, shot, signIn, waitUntil } from './harness.mjs';

/**
 * Starts the login of a provider whose redirect rota does not serve (its "Add account" opens the
 * paste panel) and returns the authorize URL of #paste-open.
 */
async function startPaste(page, provider) {
  await page.locator(`section[data-provider="${provider}"] [data-action="add-account"]`).click();
  const open = page.locator('#paste-open');
  await open.waitFor();
  return open.getAttribute('href');
}

/** Follows the authorize URL in a second page, logs `login` in, returns the redirect URL. */
async function loginForPaste(page, idp, href, login) {
  const second = await page.context().newPage();
  try {
    const redirect = capturePasteRedirect(second);
    await second.goto(href);
    assert.deepEqual(await idpLogin(second, idp, login), ['login', 'consent']);
    return await redirect;
  } finally {
    await second.close();
  }
}

/** Pastes `url`, submits, and returns the status of POST /api/v1/oauth/{provider}/paste. */
async function paste(page, provider, url) {
  await page.locator('#paste-url').fill(url);
  const answer = page.waitForResponse((r) => r.request().method() === 'POST' && r.url().endsWith(`/api/v1/oauth/${provider}/paste`));
  await page.locator('#paste-submit').click();
  return (await answer).status();
}

e2e('paste-URL flow: a pasted redirect adds the profile; forged state or duplicated code is refused', { timeoutMs: 150_000 }, async (t, env) => {
  const { rota, idp } = env;
  const page = await newPage(env.browser);
  await signIn(page, rota);

  // -- the genuine paste --------------------------------------------------------------------------
  const href = await startPaste(page, 'corppaste');
  const authorize = new URL(href);
  assert.equal(`${authorize.origin}${authorize.pathname}`, idp.authorize_url);
  assert.equal(authorize.searchParams.get('redirect_uri'), PASTE_REDIRECT);
  assert.equal(authorize.searchParams.get('client_id'), 'rota');
  assert.equal(authorize.searchParams.get('code_challenge_method'), 'S256');
  assert.match(authorize.searchParams.get('code_challenge') ?? '', /^[A-Za-z0-9_-]{43}$/);
  assert.equal(authorize.searchParams.get('prompt'), 'consent');
  assert.deepEqual(authorize.searchParams.get('scope').split(' ').sort(), ['email', 'offline_access', 'openid']);
  assert.ok((authorize.searchParams.get('state') ?? '').length >= 16, 'an unguessable state');
  await shot(page, 'flows-paste');

  const redirect = await loginForPaste(page, idp, href, 'alice');
  const landed = new URL(redirect);
  assert.equal(`${landed.origin}${landed.pathname}`, PASTE_REDIRECT);
  assert.equal(landed.searchParams.get('state'), authorize.searchParams.get('state'));
  assert.equal(await paste(page, 'corppaste', redirect), 201);
  const row = page.locator('tr[data-profile="corppaste:alice@example.com"]');
  await row.waitFor();
  assert.equal((await row.locator('.type').innerText()).trim(), 'oauth');
  assert.equal((await row.locator('.email').innerText()).trim(), 'alice@example.com');
  assert.equal((await idp.stats()).code_grants, 1);
  await shot(page, 'flows-paste-added');

  // -- a forged state: refused before any code exchange ------------------------------------------
  const href2 = await startPaste(page, 'corppaste');
  const redirect2 = await loginForPaste(page, idp, href2, 'dave');
  const forged = new URL(redirect2);
  forged.searchParams.set('state', randomToken());
  const forgedStatus = await paste(page, 'corppaste', forged.href);
  assert.ok(forgedStatus >= 400 && forgedStatus < 500, `a forged state answers 4xx, got ${forgedStatus}`);
  const errors = page.locator('#view-profiles .notice[data-kind="error"]');
  await waitUntil(async () => (await errors.count()) === 1, { message: 'the profiles tab shows the refusal' });

  // -- the same redirect with its code parameter twice ---------------------------------------------
  const code = new URL(redirect2).searchParams.get('code');
  const duplicated = `${redirect2}&code=${encodeURIComponent(code)}`;
  assert.equal(new URL(duplicated).searchParams.getAll('code').length, 2);
  const dupStatus = await paste(page, 'corppaste', duplicated);
  assert.ok(dupStatus >= 400 && dupStatus < 500, `a duplicated code answers 4xx, got ${dupStatus}`);
  await waitUntil(async () => (await errors.count()) === 2, { message: 'the profiles tab shows the second refusal' });

  assert.equal(await page.locator('tr[data-profile="corppaste:dave@example.com"]').count(), 0);
  assert.equal(await rota.profile('corppaste:dave@example.com'), undefined, 'no profile from a refused paste');
  assert.equal((await idp.stats()).code_grants, 1, 'no code was exchanged for a refused paste');
});

e2e('device flow: the user code shown in the console, entered on the IdP, adds the account', { timeoutMs: 120_000 }, async (t, env) => {
  const { rota, idp } = env;
  const page = await newPage(env.browser);
  await signIn(page, rota);
  await page.locator('section[data-provider="corp"] [data-action="device-login"]').click();
  const codeEl = page.locator('#device-code');
  await codeEl.waitFor();
  const userCode = (await codeEl.innerText()).trim();
  const link = new URL(await page.locator('a#device-link').getAttribute('href'));
  assert.equal(`${link.origin}${link.pathname}`, `${idp.issuer}/device`);
  assert.equal(link.searchParams.get('user_code'), userCode, 'the link is verification_uri_complete for the code shown');
  await shot(page, 'flows-device');

  // The user opens the verification page and types the code shown.
  const second = await page.context().newPage();
  await second.goto(`${link.origin}${link.pathname}`);
  const steps = await idpLogin(second, idp, 'carol', { userCode });
  assert.deepEqual(steps, ['user_code', 'device_confirm', 'login', 'consent', 'device_success']);
  await second.close();

  // The console polls the flow; the row appears by itself.
  const row = page.locator('tr[data-profile="corp:carol@example.com"]');
  await row.waitFor({ timeout: 40_000 });
  assert.equal((await row.locator('.type').innerText()).trim(), 'oauth');
  assert.equal((await row.locator('.email').innerText()).trim(), 'carol@example.com');
  assert.equal((await idp.stats()).device_grants, 1);
  const p = await rota.profile('corp:carol@example.com');
  assert.equal(p.type, 'oauth');
  assert.equal(p.email, 'carol@example.com');

  // The new account serves the gateway with its device-flow access token.
  const r = await rota.chat();
  assert.equal(r.status, 200, r.text);
  assert.equal(r.headers.get('x-rota-profile'), 'corp:carol@example.com');
  const seen = await env.upstream.seen();
  assert.equal(seen.at(-1).authorization, `Bearer ${(await idp.latest('carol', 'urn:ietf:params:oauth:grant-type:device_code')).access_token}`);
});

// With the IdP on 127.0.0.1 (the other tests) it is on the same site as rota, so the browser
// sends rota's SameSite=Strict session cookie along the whole redirect chain back from the IdP.
// A real IdP is another site: the redirect to /oauth/callback and on to /ui/?added=… then comes
// without that cookie. This test puts the IdP on http://localhost:P (another site than
// 127.0.0.1) and checks that the user still lands in a signed-in console.
e2e('add account with the IdP on another site: back in the signed-in console', {
  timeoutMs: 90_000,
  idpHost: 'localhost',
}, async (t, env) => {
  const { rota, idp } = env;
  assert.match(idp.issuer, /^http:\/\/localhost:\d+$/);
  const page = await newPage(env.browser);
  await signIn(page, rota);
  await page.locator('section[data-provider="corp"] [data-action="add-account"]').click();
  await page.waitForURL((u) => u.href.startsWith(`${idp.issuer}/`));
  const callback = page.waitForResponse((r) => r.url().startsWith(`${rota.url}/oauth/callback?`));
  assert.deepEqual(await idpLogin(page, idp, 'erin'), ['login', 'consent']);
  const answer = await callback;
  await page.waitForLoadState('domcontentloaded');
  const shown = answer.status() >= 400 ? await page.locator('body').innerText().catch(() => '') : '';
  assert.ok(answer.status() < 400,
    `rota's /oauth/callback answered ${answer.status()} ("${shown.trim()}"): a redirect that an IdP on another site started carries no SameSite=Strict cookie`);
  await rota.waitProfile('corp:erin@example.com');
  await waitUntil(async () => (await page.locator('#tab-profiles').count()) > 0 || (await page.locator('#admin-key').count()) > 0,
    { message: 'the console or the sign-in page' });
  await shot(page, 'flows-cross-site-return');
  assert.equal(await page.locator('#admin-key').isVisible().catch(() => false), false,
    `back from the IdP the page asks to sign in again (${page.url()}): the SameSite=Strict session cookie is not sent on a navigation that a cross-site redirect started`);
  await page.locator('tr[data-profile="corp:erin@example.com"]').waitFor();
});
