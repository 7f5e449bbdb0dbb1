// The console's and the admin API's security properties: nothing without a session or key, CSRF
// on every mutation made with the session cookie, the cookie's flags, the OAuth callback's
// state and browser checks (a forged callback from another browser is refused and does not
// spend the login), the console's CSP, and no secret (tokens, client secret, API keys) in any
// page.

import assert from 'node:assert/strict';

import { CLIENT_SECRET, apiLogin, e2e, idpLogin, newPage, randomToken, signIn } from './harness.mjs';

const ALICE = 'corp:alice@example.com';
const STATIC = 'corp:static';
const STATIC_SECRET = `sk-static-${randomToken(24)}`;

/** The openapi.json operations under /api/v1 as [method, path template]. */
async function operations(rota) {
  const r = await rota.api('GET', '/api/v1/openapi.json', { key: null });
  assert.equal(r.status, 200, 'openapi.json needs no key');
  const ops = [];
  for (const [path, item] of Object.entries(r.json.paths)) {
    if (!path.startsWith('/api/v1/')) continue;
    for (const method of ['get', 'post', 'put', 'delete', 'patch']) {
      if (item[method]) ops.push([method.toUpperCase(), path]);
    }
  }
  return ops;
}

/** A concrete path: {id} -> the static profile, {provider} -> corp, other params -> a dummy. */
function concrete(path) {
  return path.replace(/\{([^}]+)\}/g, (_, name) => {
    if (name === 'id' || name === 'profile') return encodeURIComponent(STATIC);
    if (name === 'provider') return 'corp';
    if (name === 'name' || name === 'agent') return 'nobody';
    return 'x';
  });
}

function sessionCookie(setCookies) {
  return setCookies.find((c) => c.startsWith('rota_session='));
}

e2e('security: sessions, CSRF, cookie flags, callback state, no secrets in pages', { timeoutMs: 150_000 }, async (t, env) => {
  const { rota, idp } = env;
  // Data that must not leak: an OAuth account and a static API key.
  await apiLogin(env, 'alice');
  const added = await rota.api('POST', '/api/v1/profiles', { body: { provider: 'corp', name: 'static', type: 'api_key', secret: STATIC_SECRET } });
  assert.equal(added.status, 201, added.text);
  assert.equal((await rota.chat()).status, 200); // some attempts for the log

  // -- without a session ----------------------------------------------------------------------
  const anon = await rota.api('GET', '/ui/', { key: null });
  assert.equal(anon.status, 200);
  assert.match(anon.text, /id="admin-key"/);
  assert.match(anon.text, /id="sign-in"/);
  for (const leak of ['alice@example.com', STATIC, 'data-profile']) {
    assert.ok(!anon.text.includes(leak), `the sign-in page's HTML does not contain ${leak}`);
  }

  const page = await newPage(env.browser);
  const apiAnswers = [];
  page.on('response', (r) => {
    if (new URL(r.url()).pathname.startsWith('/api/v1/')) apiAnswers.push([r.status(), r.url()]);
  });
  await page.goto(`${rota.url}/ui/`);
  await page.locator('#admin-key').waitFor();
  await page.waitForTimeout(1_000); // give the page's scripts time to ask for data
  assert.equal(await page.locator('tr[data-profile]').count(), 0, 'no profile rows without a session');
  assert.ok(!(await page.content()).includes('alice@example.com'));
  assert.deepEqual(apiAnswers.filter(([s, u]) => s === 200 && !u.endsWith('/openapi.json')), [], 'no API data reached the sign-in page');

  const ops = await operations(rota);
  const gets = ops.filter(([m, p]) => m === 'GET' && p !== '/api/v1/openapi.json');
  for (const must of ['/api/v1/profiles', '/api/v1/providers', '/api/v1/session']) {
    assert.ok(gets.some(([, p]) => p === must), `openapi.json documents GET ${must}`);
  }
  for (const [, path] of gets) {
    const bare = await rota.api('GET', concrete(path), { key: null });
    assert.equal(bare.status, 401, `GET ${path} without a session or key: ${bare.status} ${bare.text}`);
    const forged = await rota.api('GET', concrete(path), { key: null, cookie: `rota_session=${randomToken()}` });
    assert.equal(forged.status, 401, `GET ${path} with a forged session cookie: ${forged.status}`);
  }

  // -- signing in: the cookie ---------------------------------------------------------------------
  const wrong = await rota.api('POST', '/api/v1/session', { key: null, body: { key: `rk_${randomToken()}` } });
  assert.equal(wrong.status, 401, 'a wrong key signs nobody in');
  assert.equal(sessionCookie(wrong.headers.getSetCookie()), undefined);

  const signed = await rota.api('POST', '/api/v1/session', { key: null, body: { key: rota.adminKey } });
  assert.equal(signed.status, 200, signed.text);
  assert.equal(signed.json.agent, 'ops');
  const { csrf } = signed.json;
  assert.ok(typeof csrf === 'string' && csrf.length >= 16, 'a csrf token');
  const setCookie = sessionCookie(signed.headers.getSetCookie());
  assert.ok(setCookie, 'Set-Cookie: rota_session=…');
  const attrs = setCookie.split(';').map((s) => s.trim().toLowerCase());
  assert.ok(attrs.includes('httponly'), setCookie);
  assert.ok(attrs.includes('samesite=strict'), setCookie);
  assert.ok(attrs.includes('path=/'), setCookie);
  const cookie = setCookie.split(';')[0];
  assert.ok(!cookie.includes(rota.adminKey), 'the cookie is not the admin key');

  const session = await rota.api('GET', '/api/v1/session', { key: null, cookie });
  assert.equal(session.status, 200);
  assert.deepEqual(session.json, { agent: 'ops', kind: 'agent', role: 'admin', csrf });
  assert.equal((await rota.api('GET', '/api/v1/profiles', { key: null, cookie })).status, 200, 'the cookie opens the admin API');

  // -- CSRF: every mutation with the cookie needs x-csrf-token ------------------------------------
  const mutations = ops.filter(([m, p]) => m !== 'GET' && !(m === 'POST' && p === '/api/v1/session') && !p.startsWith('/api/v1/leases'));
  for (const must of [['POST', '/api/v1/profiles'], ['DELETE', '/api/v1/profiles/{id}'], ['PUT', '/api/v1/providers/{provider}/order']]) {
    assert.ok(mutations.some(([m, p]) => m === must[0] && p === must[1]), `openapi.json documents ${must.join(' ')}`);
  }
  t.diagnostic(`checked ${gets.length} GET and ${mutations.length} mutating operations of openapi.json`);
  for (const [method, path] of mutations) {
    const body = method === 'DELETE' ? undefined : {};
    const r = await rota.api(method, concrete(path), { key: null, cookie, body });
    assert.equal(r.status, 403, `${method} ${path} with the cookie and no x-csrf-token: ${r.status} ${r.text}`);
    assert.equal(r.json?.error?.type, 'csrf', `${method} ${path}: error.type`);
  }
  const wrongCsrf = await rota.api('POST', `/api/v1/profiles/${encodeURIComponent(STATIC)}/disable`, { key: null, cookie, csrf: randomToken() });
  assert.equal(wrongCsrf.status, 403, 'a wrong x-csrf-token');
  assert.equal(wrongCsrf.json?.error?.type, 'csrf');
  // Nothing above went through: the static profile is untouched, the session alive.
  const staticNow = await rota.profile(STATIC);
  assert.ok(staticNow, 'the static profile still exists');
  assert.equal(staticNow.enabled, true, 'and is still enabled');
  assert.equal((await rota.api('GET', '/api/v1/session', { key: null, cookie })).status, 200, 'the session was not signed out');
  // With the token, and with the admin key (no cookie, no token), the same call works.
  const withCsrf = await rota.api('POST', `/api/v1/profiles/${encodeURIComponent(STATIC)}/disable`, { key: null, cookie, csrf });
  assert.equal(withCsrf.status, 200, withCsrf.text);
  assert.equal(withCsrf.json.enabled, false);
  const withKey = await rota.api('POST', `/api/v1/profiles/${encodeURIComponent(STATIC)}/enable`);
  assert.equal(withKey.status, 200, withKey.text);

  // Signing out ends the session.
  const out = await rota.api('DELETE', '/api/v1/session', { key: null, cookie, csrf });
  assert.ok(out.status === 200 || out.status === 204, `DELETE /api/v1/session: ${out.status}`);
  assert.equal((await rota.api('GET', '/api/v1/profiles', { key: null, cookie })).status, 401, 'the old cookie is dead');

  // -- the OAuth callback checks its state ----------------------------------------------------------
  const codesBefore = (await idp.stats()).code_grants;
  const cb = await rota.api('GET', `/oauth/callback?code=${randomToken()}&state=${randomToken()}`, { key: null });
  assert.equal(cb.status, 400, `forged state: ${cb.status}`);
  const started = await rota.api('POST', '/api/v1/oauth/corp/authorize', { body: {} });
  assert.equal(started.status, 200, started.text);
  const realState = started.json.state;
  const dup = await rota.api('GET', `/oauth/callback?code=a&state=${encodeURIComponent(realState)}&code=b`, { key: null });
  assert.equal(dup.status, 400, `duplicated code: ${dup.status}`);
  assert.equal((await idp.stats()).code_grants, codesBefore, 'no code exchange for a refused callback');

  // -- a forged callback from another browser: refused, and the real browser still finishes ------
  // A login started with the admin key answers with rota's /oauth/go link; the browser that opens
  // it is the one bound to the login. Another browser that knows the state calls the callback
  // first (route interception cannot hold a redirected navigation, so it forges the code too).
  const viaKey = await rota.api('POST', '/api/v1/oauth/corp/authorize', { body: {} });
  assert.equal(viaKey.status, 200, viaKey.text);
  assert.ok(viaKey.json.authorize_url.startsWith(`${rota.url}/oauth/go?ticket=`), viaKey.json.authorize_url);
  const real = await newPage(env.browser);
  await real.goto(viaKey.json.authorize_url);
  assert.ok(real.url().startsWith(`${new URL(idp.issuer).origin}/`), `the go link led to the IdP: ${real.url()}`);
  const codesHeld = (await idp.stats()).code_grants;
  const other = await newPage(env.browser);
  const forgedUrl = `${rota.url}/oauth/callback?code=${randomToken()}&state=${encodeURIComponent(viaKey.json.state)}`;
  const forgedAnswer = await other.goto(forgedUrl);
  assert.equal(forgedAnswer.status(), 403, 'the callback from another browser');
  assert.match(await other.locator('#error').innerText(), /another browser/);
  assert.equal((await other.goto(viaKey.json.authorize_url)).status(), 400, 'the go link binds one browser only');
  await other.context().close();
  assert.equal((await idp.stats()).code_grants, codesHeld, 'no code exchange for the forged callback');
  await idpLogin(real, idp, 'erin');
  await real.waitForURL((u) => u.href.startsWith(`${rota.url}/ui/`));
  await rota.waitProfile('corp:erin@example.com'); // the real browser still finished: the state was not spent
  await real.context().close();

  // -- the browser: cookie jar, and no secret in any page ---------------------------------------------
  const console_ = await newPage(env.browser);
  const cspViolations = [];
  console_.on('console', (m) => {
    if (/Content Security Policy|Content-Security-Policy/i.test(m.text())) cspViolations.push(m.text());
  });
  await signIn(console_, rota);
  const jar = (await console_.context().cookies(rota.url)).find((c) => c.name === 'rota_session');
  assert.ok(jar, 'the browser holds rota_session');
  assert.equal(jar.httpOnly, true);
  assert.equal(jar.sameSite, 'Strict');
  assert.ok(!(await console_.evaluate(() => document.cookie)).includes('rota_session'), 'scripts cannot read the session cookie');
  await console_.locator(`tr[data-profile="${ALICE}"]`).waitFor();
  await console_.locator(`tr[data-profile="${STATIC}"]`).waitFor();

  const issued = await idp.issued();
  const secrets = new Map([
    ['the client secret', CLIENT_SECRET],
    ['the static API key', STATIC_SECRET],
    ['the admin key', rota.adminKey],
  ]);
  for (const i of issued) {
    secrets.set(`${i.account}'s access token`, i.access_token);
    if (i.refresh_token) secrets.set(`${i.account}'s refresh token`, i.refresh_token);
  }
  assert.ok(secrets.size >= 5, 'the IdP issued alice an access and a refresh token');

  const sources = {
    'view-source of /ui/': await (await console_.context().request.get(`${rota.url}/ui/`)).text(),
    'the profiles tab DOM': await console_.content(),
    'GET /api/v1/profiles': (await rota.api('GET', '/api/v1/profiles')).text,
    'GET /api/v1/providers': (await rota.api('GET', '/api/v1/providers')).text,
  };
  await console_.locator('#tab-requests').click();
  await console_.locator('#requests tbody tr').first().waitFor();
  sources['the requests tab DOM'] = await console_.content();
  await console_.locator('#tab-overview').click();
  await console_.locator('#charts figure').first().waitFor();
  sources['the overview DOM'] = await console_.content();
  await console_.locator('#tab-agents').click();
  await console_.locator('#agents tr[data-agent]').first().waitFor();
  sources['the agents tab DOM'] = await console_.content();
  await console_.locator('#tab-chains').click();
  await console_.locator('#chains').waitFor();
  sources['the chains tab DOM'] = await console_.content();
  sources['form field values and web storage'] = await console_.evaluate(() => JSON.stringify({
    fields: [...document.querySelectorAll('input, textarea')].map((e) => e.value),
    local: { ...localStorage },
    session: { ...sessionStorage },
  }));
  assert.match(sources['view-source of /ui/'], /tab-profiles|<script/, 'view-source got the console page');
  assert.deepEqual(cspViolations, [], 'the console runs under its CSP without a violation');
  for (const [where, text] of Object.entries(sources)) {
    for (const [what, secret] of secrets) {
      assert.ok(!text.includes(secret), `${where} contains ${what}`);
    }
  }
});
