// The test peers on their own, without rota: the IdP (idp.mjs) answers the authorization code
// flow with PKCE, refresh-token rotation, the device flow, userinfo and its control API as the
// other tests rely on; the upstream (upstream.mjs) records tokens and plays scripted replies;
// the harness drives the IdP's real pages in Chromium.

import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  CLIENT_ID, CLIENT_SECRET, PASTE_REDIRECT, capturePasteRedirect, freePort, idpLogin, launchBrowser, newPage, shot, startIdp, startUpstream,
} from './harness.mjs';

const b64url = (buf) => Buffer.from(buf).toString('base64url');
const pkce = () => {
  const verifier = b64url(randomBytes(32));
  return { verifier, challenge: b64url(createHash('sha256').update(verifier).digest()) };
};

async function form(url, params, { basic = false } = {}) {
  const body = new URLSearchParams(params);
  const headers = { 'content-type': 'application/x-www-form-urlencoded' };
  if (basic) {
    headers.authorization = `Basic ${Buffer.from(`${CLIENT_ID}:${CLIENT_SECRET}`).toString('base64')}`;
  } else {
    body.set('client_id', CLIENT_ID);
    body.set('client_secret', CLIENT_SECRET);
  }
  const res = await fetch(url, { method: 'POST', headers, body, signal: AbortSignal.timeout(10_000) });
  return { status: res.status, json: await res.json() };
}

describe('test peers', { timeout: 120_000 }, () => {
  let dir;
  let idp;
  let upstream;
  let browser;
  let cbPort;
  let callbackServer;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rota-peers-'));
    cbPort = await freePort();
    // Stands in for rota's /oauth/callback: answers a blank page.
    callbackServer = http.createServer((req, res) => res.end('<title>callback</title>'));
    await new Promise((r) => callbackServer.listen(cbPort, '127.0.0.1', r));
    idp = await startIdp({ dir, accessTtl: 20, redirectUris: [`http://127.0.0.1:${cbPort}/oauth/callback`, PASTE_REDIRECT] });
    upstream = await startUpstream({ dir });
    browser = await launchBrowser();
  });

  after(async () => {
    await browser?.close();
    await idp?.stop();
    await upstream?.stop();
    callbackServer?.close();
    callbackServer?.closeAllConnections();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Authorization code + PKCE in the browser; returns the redirect's URL. */
  async function authorize(login, { redirectUri = `http://127.0.0.1:${cbPort}/oauth/callback`, prompt = 'consent', challenge, state = 's1' } = {}) {
    const page = await newPage(browser);
    // The paste-flow redirect target does not listen: keep the URL the browser went to.
    const paste = redirectUri === PASTE_REDIRECT ? capturePasteRedirect(page) : undefined;
    const url = new URL(idp.authorize_url);
    Object.entries({
      client_id: CLIENT_ID, response_type: 'code', redirect_uri: redirectUri, scope: 'openid email offline_access',
      state, code_challenge: challenge, code_challenge_method: 'S256', prompt,
    }).forEach(([k, v]) => v !== undefined && url.searchParams.set(k, v));
    await page.goto(url.href);
    const steps = await idpLogin(page, idp, login);
    const landed = paste ? await paste : page.url();
    await page.context().close();
    return { steps, landed: new URL(landed) };
  }

  test('ready line names the endpoints of the discovery document', async () => {
    const disc = await (await fetch(`${idp.issuer}/.well-known/openid-configuration`)).json();
    assert.equal(idp.issuer, disc.issuer);
    assert.equal(idp.authorize_url, disc.authorization_endpoint);
    assert.equal(idp.token_url, disc.token_endpoint);
    assert.equal(idp.device_url, disc.device_authorization_endpoint);
    assert.equal(idp.userinfo_url, disc.userinfo_endpoint);
    assert.match(idp.issuer, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.ok(disc.grant_types_supported.includes('urn:ietf:params:oauth:grant-type:device_code'));
    assert.deepEqual(disc.code_challenge_methods_supported, ['S256']);
  });

  test('code flow: login and consent pages, PKCE, basic and post auth, rotation, userinfo, control API', async () => {
    const before0 = await idp.stats();
    const p = pkce();
    const { steps, landed } = await authorize('alice', { challenge: p.challenge });
    assert.deepEqual(steps, ['login', 'consent']);
    assert.equal(landed.searchParams.get('state'), 's1');
    const code = landed.searchParams.get('code');
    assert.ok(code);

    // A wrong verifier is refused (PKCE is checked), then the right one works once.
    const redirect = `http://127.0.0.1:${cbPort}/oauth/callback`;
    const bad = await form(idp.token_url, { grant_type: 'authorization_code', code, redirect_uri: redirect, code_verifier: pkce().verifier });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error, 'invalid_grant');

    // (A refused exchange spends the code in oidc-provider: log in again.)
    const p2 = pkce();
    const again = await authorize('alice', { challenge: p2.challenge });
    assert.deepEqual(again.steps, ['login', 'consent'], 'the IdP asks for a login on every authorization');
    const tok = await form(idp.token_url, {
      grant_type: 'authorization_code', code: again.landed.searchParams.get('code'), redirect_uri: redirect, code_verifier: p2.verifier,
    }, { basic: true });
    assert.equal(tok.status, 200, JSON.stringify(tok.json));
    assert.equal(tok.json.expires_in, 20, 'accessTtl from the config');
    assert.ok(tok.json.refresh_token, 'offline_access with prompt=consent gives a refresh token');
    const [, payload] = tok.json.id_token.split('.');
    assert.equal(JSON.parse(Buffer.from(payload, 'base64url')).email, 'alice@example.com');

    const me = await (await fetch(idp.userinfo_url, { headers: { authorization: `Bearer ${tok.json.access_token}` } })).json();
    assert.deepEqual(me, { sub: 'alice', email: 'alice@example.com', email_verified: true });

    // Refresh with client_secret_post; the old refresh token is then spent.
    const r1 = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: tok.json.refresh_token });
    assert.equal(r1.status, 200, JSON.stringify(r1.json));
    assert.notEqual(r1.json.refresh_token, tok.json.refresh_token, 'rotated');
    assert.notEqual(r1.json.access_token, tok.json.access_token);

    const stats = await idp.stats();
    assert.equal(stats.code_grants - before0.code_grants, 1);
    assert.equal(stats.refresh_grants - before0.refresh_grants, 1);
    const latest = await idp.latest('alice');
    assert.equal(latest.grant_type, 'refresh_token');
    assert.equal(latest.access_token, r1.json.access_token);
    assert.equal(latest.refresh_token, r1.json.refresh_token);

    // reuseDetection off: the spent token answers invalid_grant and the grant lives on.
    await idp.configure({ reuseDetection: false });
    const reused = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: tok.json.refresh_token });
    assert.equal(reused.status, 400);
    assert.equal(reused.json.error, 'invalid_grant');
    const r2 = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: r1.json.refresh_token });
    assert.equal(r2.status, 200, 'the grant survived the reuse');

    // reuseDetection on (oidc-provider's default): a reuse revokes the whole grant.
    await idp.configure({ reuseDetection: true });
    const reused2 = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: r1.json.refresh_token });
    assert.equal(reused2.status, 400);
    const dead = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: r2.json.refresh_token });
    assert.equal(dead.status, 400);
    assert.equal(dead.json.error, 'invalid_grant');
    assert.equal((await idp.stats()).failures['refresh_token invalid_grant'] >= 3, true);
  });

  test('PKCE is required', async () => {
    const page = await newPage(browser);
    const url = new URL(idp.authorize_url);
    url.search = new URLSearchParams({
      client_id: CLIENT_ID, response_type: 'code', redirect_uri: `http://127.0.0.1:${cbPort}/oauth/callback`,
      scope: 'openid', state: 'x',
    }).toString();
    await page.goto(url.href);
    const landed = new URL(page.url());
    await page.context().close();
    assert.equal(landed.searchParams.get('error'), 'invalid_request');
    assert.match(landed.searchParams.get('error_description'), /PKCE/);
  });

  test('paste redirect (localhost:1455) and revoke', async () => {
    const p = pkce();
    const { landed } = await authorize('bob', { redirectUri: PASTE_REDIRECT, challenge: p.challenge, state: 'paste-state' });
    assert.equal(`${landed.origin}${landed.pathname}`, PASTE_REDIRECT);
    assert.equal(landed.searchParams.get('state'), 'paste-state');
    const tok = await form(idp.token_url, {
      grant_type: 'authorization_code', code: landed.searchParams.get('code'), redirect_uri: PASTE_REDIRECT, code_verifier: p.verifier,
    });
    assert.equal(tok.status, 200, JSON.stringify(tok.json));
    const { revoked } = await idp.revoke('bob');
    assert.ok(revoked >= 1);
    const after1 = await form(idp.token_url, { grant_type: 'refresh_token', refresh_token: tok.json.refresh_token });
    assert.equal(after1.status, 400);
    assert.equal(after1.json.error, 'invalid_grant');
    const me = await fetch(idp.userinfo_url, { headers: { authorization: `Bearer ${tok.json.access_token}` } });
    assert.equal(me.status, 401, 'the access token is revoked too');
  });

  test('device flow through the user-code page', async () => {
    const before0 = await idp.stats();
    const da = await form(idp.device_url, { scope: 'openid email offline_access' });
    assert.equal(da.status, 200, JSON.stringify(da.json));
    const poll = () => form(idp.token_url, { grant_type: 'urn:ietf:params:oauth:grant-type:device_code', device_code: da.json.device_code });
    assert.equal((await poll()).json.error, 'authorization_pending');

    // The plain verification URI: the code is typed in.
    const page = await newPage(browser);
    await page.goto(da.json.verification_uri);
    await shot(page, 'idp-device-code');
    const steps = await idpLogin(page, idp, 'carol', { userCode: da.json.user_code });
    await page.context().close();
    assert.deepEqual(steps, ['user_code', 'device_confirm', 'login', 'consent', 'device_success']);
    const tok = await poll();
    assert.equal(tok.status, 200, JSON.stringify(tok.json));
    assert.ok(tok.json.refresh_token);
    assert.equal((await idp.stats()).device_grants - before0.device_grants, 1);
    assert.equal((await idp.latest('carol')).access_token, tok.json.access_token);

    // verification_uri_complete pre-fills the code.
    const da2 = await form(idp.device_url, { scope: 'openid email offline_access' });
    const page2 = await newPage(browser);
    await page2.goto(da2.json.verification_uri_complete);
    const steps2 = await idpLogin(page2, idp, 'dave');
    await page2.context().close();
    assert.deepEqual(steps2, ['device_confirm', 'login', 'consent', 'device_success']);
  });

  test('upstream: records bearer tokens, plays scripted replies per token prefix', async () => {
    const call = (token) => fetch(`${upstream.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await upstream.clearSeen();
    await upstream.script({ token_prefix: 'tok-a', replies: [{ status: 429, headers: { 'retry-after': '30' }, body: { error: { message: 'slow down' } } }] });
    const a1 = await call('tok-a-1');
    assert.equal(a1.status, 429);
    assert.equal(a1.headers.get('retry-after'), '30');
    assert.equal((await a1.json()).error.message, 'slow down');
    const b1 = await call('tok-b-1');
    assert.equal(b1.status, 200);
    const body = await b1.json();
    assert.equal(body.usage.total_tokens, 10);
    assert.equal(body.choices[0].message.role, 'assistant');
    assert.equal((await call('tok-a-2')).status, 200, 'then 200s');
    const seen = await upstream.seen();
    assert.deepEqual(seen.map((s) => [s.authorization, s.model, s.status]), [
      ['Bearer tok-a-1', 'gpt-4o-mini', 429], ['Bearer tok-b-1', 'gpt-4o-mini', 200], ['Bearer tok-a-2', 'gpt-4o-mini', 200],
    ]);
  });
});
