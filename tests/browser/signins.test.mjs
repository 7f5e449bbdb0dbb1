// Adding accounts from the console through the sign-ins a preset names (web/js/profiles.js,
// `sign_ins`), against fakes of the real identity providers that enforce their protocols
// (accounts.mjs): Microsoft Entra ID (authorization code + PKCE with a rotated refresh token, the
// device code flow, a client secret), Google (authorization code + PKCE, offline access, a refresh
// token that is not rotated; a service-account key) and ChatGPT's own device sign-in as the Codex
// CLI does it. Each account's token then goes upstream on a gateway request (upstream.mjs checks
// the Codex backend's rules). The first test checks the fakes on their own, without rota.
//
// Screenshots for the docs: add-account-{microsoft,microsoft-device,google,service-account,
// chatgpt-device,client-secret}.

import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import {
  ENTRA_CLIENT_ID, ENTRA_SECRET, GOOGLE_CLIENT_ID, GOOGLE_SECRET,
  docShot, e2e, newPage, shot, signIn, sleepUntil, startAccounts, waitUntil,
} from './harness.mjs';

const CODEX_CLIENT_ID = 'app_EMoamEEZ73f0CkXaXp7hrann';
const COGNITIVE = 'https://cognitiveservices.azure.com/.default';
const CLOUD_PLATFORM = 'https://www.googleapis.com/auth/cloud-platform';
const AZURE_MODEL = 'azure/gpt-4.1';
const VERTEX_MODEL = 'vertex/google/gemini-2.5-flash';
const CODEX_MODEL = 'chatgpt/gpt-5-codex';

/** The three providers of the catalog, their identity providers being accounts.mjs. */
const PROVIDERS = ({ upstream, accounts }) => `
[providers.azure]
preset = "azure-openai"
resource = "contoso"
tenant = "contoso"
base_url = "${upstream.url}/v1"

[providers.azure.oauth]
client_id = "${ENTRA_CLIENT_ID}"
client_secret_env = "ENTRA_SECRET"
authorize_url = "${accounts.url}/contoso/oauth2/v2.0/authorize"
token_url = "${accounts.url}/contoso/oauth2/v2.0/token"
device_url = "${accounts.url}/contoso/oauth2/v2.0/devicecode"

[providers.azure.client_credentials]
token_url = "${accounts.url}/contoso/oauth2/v2.0/token"

[providers.vertex]
preset = "vertex"
project = "acme-ml"
location = "us-central1"
base_url = "${upstream.url}/v1"

[providers.vertex.client_credentials]
allow_token_uri = "${upstream.url}/token"

[providers.vertex.oauth]
client_id = "${GOOGLE_CLIENT_ID}"
client_secret_env = "GOOGLE_SECRET"
authorize_url = "${accounts.url}/o/oauth2/v2/auth"
token_url = "${accounts.url}/token"

[providers.chatgpt]
preset = "codex"
base_url = "${upstream.url}/codex"

[providers.chatgpt.oauth]
token_url = "${accounts.url}/oauth/token"
device_url = "${accounts.url}/api/accounts/deviceauth/usercode"
authorize_url = "${accounts.url}/oauth/authorize"
`;

const withAccounts = (options = {}) => ({ timeoutMs: 60_000, accounts: true, extraToml: PROVIDERS, ...options });

const card = (page, provider) => page.locator(`#providers section[data-provider="${provider}"]`);
const labels = async (section) => (await section.locator('.actions button').allInnerTexts()).map((s) => s.trim());
const row = (page, id) => page.locator(`tr[data-profile="${id}"]`);
const claims = (jwt) => JSON.parse(Buffer.from(jwt.split('.')[1], 'base64url').toString('utf8'));

/** A gateway chat pinned to `profile`. */
function chat(rota, model, profile) {
  return rota.api('POST', '/v1/chat/completions', {
    body: { model, messages: [{ role: 'user', content: 'hi' }] },
    headers: { 'x-rota-profile': profile },
    timeoutMs: 30_000,
  });
}

/** The access token the fake had granted last before `at` (ms) to `account` at `idp`. */
async function newestBefore(accounts, idp, account, at) {
  return (await accounts.issued()).filter((i) => i.idp === idp && i.account === account && i.at <= at).at(-1);
}

/** Asserts that none of `secrets` is in the page's HTML. */
async function assertNoSecrets(page, secrets) {
  const content = await page.content();
  for (const [what, secret] of Object.entries(secrets)) {
    assert.ok(secret && !content.includes(secret), `${what} is not in the page`);
  }
}

/** Clicks the card's browser sign-in and follows rota's redirect to the identity provider; its address. */
async function startBrowserSignIn(page, section, accounts) {
  await section.locator('.actions [data-action="add-account"]').click();
  await page.waitForURL((u) => u.href.startsWith(`${accounts.url}/`));
  return new URL(page.url());
}

// -- the fakes on their own ----------------------------------------------------------------------

test('the fake identity providers refuse what Entra ID, Google and ChatGPT refuse', { timeout: 30_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rota-accounts-'));
  const redirect = 'http://127.0.0.1:9/oauth/callback';
  const accounts = await startAccounts({ dir, redirectUris: [redirect] });
  t.after(async () => {
    await accounts.stop();
    if (!process.env.KEEP_TMP) rmSync(dir, { recursive: true, force: true });
  });
  const { url } = accounts;
  const form = (to, params, headers = {}) => fetch(`${url}${to}`, {
    method: 'POST', redirect: 'manual', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, body: new URLSearchParams(params).toString(),
  });
  const jsonPost = (to, body) => fetch(`${url}${to}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const pkce = () => {
    const verifier = randomBytes(32).toString('base64url');
    return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
  };
  const entraToken = `/contoso/oauth2/v2.0/token`;

  // Entra: the authorize checks, then a code for alice.
  const p = pkce();
  const authorize = (params) => fetch(`${url}/contoso/oauth2/v2.0/authorize?${new URLSearchParams({
    client_id: ENTRA_CLIENT_ID, response_type: 'code', redirect_uri: redirect, scope: `${COGNITIVE} offline_access openid profile`,
    code_challenge: p.challenge, code_challenge_method: 'S256', state: 's1', ...params,
  })}`, { redirect: 'manual' });
  const mismatch = await authorize({ redirect_uri: 'http://127.0.0.1:9/elsewhere' });
  assert.equal(mismatch.status, 400);
  assert.match(await mismatch.text(), /AADSTS50011/);
  const noPkce = await authorize({ code_challenge_method: 'plain' });
  assert.equal(noPkce.status, 302, 'an error after the redirect URI is checked goes back to it');
  assert.equal(new URL(noPkce.headers.get('location')).searchParams.get('error'), 'invalid_request');
  const page = await authorize({});
  assert.equal(page.status, 200);
  const ctx = /name="ctx" value="([^"]+)"/.exec(await page.text())[1];
  const signedIn = await form('/contoso/login', { ctx, login: 'alice@contoso.com' });
  assert.equal(signedIn.status, 302);
  const back = new URL(signedIn.headers.get('location'));
  assert.equal(`${back.origin}${back.pathname}`, redirect);
  assert.equal(back.searchParams.get('state'), 's1');
  assert.ok(back.searchParams.get('session_state'));
  const code = back.searchParams.get('code');
  const redeem = (params, headers) => form(entraToken, { grant_type: 'authorization_code', code, redirect_uri: redirect, code_verifier: p.verifier, client_id: ENTRA_CLIENT_ID, client_secret: ENTRA_SECRET, ...params }, headers);

  let r = await redeem({ client_secret: '' });
  assert.equal(r.status, 401);
  let e = await r.json();
  assert.equal(e.error, 'invalid_client');
  assert.deepEqual(e.error_codes, [7000218]);
  r = await redeem({ client_secret: 'wrong' });
  assert.equal(r.status, 401);
  assert.match((await r.json()).error_description, /^AADSTS7000215: .*\r\nTrace ID: [0-9a-f-]{36}\r\nCorrelation ID: [0-9a-f-]{36}\r\nTimestamp: \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/s);
  r = await redeem({ code_verifier: pkce().verifier });
  e = await r.json();
  assert.equal(r.status, 400);
  assert.equal(e.error, 'invalid_grant');
  assert.match(e.error_description, /^AADSTS501481: The Code_Verifier does not match the code_challenge supplied in the authorization request for PKCE\./);
  assert.equal(e.error_uri, 'https://login.microsoftonline.com/error?code=501481');
  r = await fetch(`${url}${entraToken}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ grant_type: 'authorization_code', code }) });
  assert.deepEqual((await r.json()).error_codes, [900144], 'a JSON body carries no form parameters');
  // HTTP Basic works as well as the form body (client_secret_basic).
  const basic = `Basic ${Buffer.from(`${encodeURIComponent(ENTRA_CLIENT_ID)}:${encodeURIComponent(ENTRA_SECRET)}`).toString('base64')}`;
  r = await redeem({ client_id: '', client_secret: '' }, { authorization: basic });
  assert.equal(r.status, 200);
  const tokens = await r.json();
  assert.deepEqual(Object.keys(tokens).sort(), ['access_token', 'expires_in', 'ext_expires_in', 'id_token', 'refresh_token', 'scope', 'token_type']);
  const id = claims(tokens.id_token);
  assert.equal(id.preferred_username, 'alice@contoso.com');
  assert.equal(id.aud, ENTRA_CLIENT_ID);
  assert.equal(id.ver, '2.0');
  assert.equal(id.email, undefined, 'Entra sends no email claim by default');
  assert.match(id.iss, /^https:\/\/login\.microsoftonline\.com\/[0-9a-f-]{36}\/v2\.0$/);
  r = await redeem({});
  assert.deepEqual((await r.json()).error_codes, [54005], 'a code works once');

  // Entra refresh: rotated; the spent token is refused (AADSTS50173).
  const refresh = (token) => form(entraToken, { grant_type: 'refresh_token', refresh_token: token, client_id: ENTRA_CLIENT_ID, client_secret: ENTRA_SECRET });
  r = await refresh(tokens.refresh_token);
  const rotated = await r.json();
  assert.equal(r.status, 200);
  assert.notEqual(rotated.refresh_token, tokens.refresh_token);
  r = await refresh(tokens.refresh_token);
  assert.deepEqual([r.status, (await r.json()).error_codes], [400, [50173]]);
  assert.equal((await accounts.latest('entra', 'alice@contoso.com', 'refresh_token')).presented, tokens.refresh_token);

  // Entra client credentials: scope .default only, no refresh token.
  r = await form(entraToken, { grant_type: 'client_credentials', client_id: ENTRA_CLIENT_ID, client_secret: 'wrong', scope: COGNITIVE });
  assert.deepEqual([r.status, (await r.json()).error_codes], [401, [7000215]]);
  r = await form(entraToken, { grant_type: 'client_credentials', client_id: ENTRA_CLIENT_ID, client_secret: ENTRA_SECRET, scope: COGNITIVE });
  const app = await r.json();
  assert.equal(r.status, 200);
  assert.equal(app.refresh_token, undefined);

  // Entra device code: client_id and scope in the body; pending until approved.
  r = await form('/contoso/oauth2/v2.0/devicecode', { scope: `${COGNITIVE} offline_access` }, { authorization: basic });
  assert.deepEqual([r.status, (await r.json()).error_codes], [400, [900144]], 'the client id in HTTP Basic only: not in the body');
  r = await form('/contoso/oauth2/v2.0/devicecode', { client_id: ENTRA_CLIENT_ID, scope: `${COGNITIVE} offline_access openid` });
  const device = await r.json();
  assert.match(device.user_code, /^[A-Z0-9]{9}$/);
  assert.equal(device.verification_uri, `${url}/contoso/devicelogin`);
  assert.equal(device.interval, 2);
  const poll = () => form(entraToken, { grant_type: 'urn:ietf:params:oauth:grant-type:device_code', device_code: device.device_code, client_id: ENTRA_CLIENT_ID });
  r = await poll();
  e = await r.json();
  assert.deepEqual([r.status, e.error, e.error_codes], [400, 'authorization_pending', [70016]]);
  r = await form('/contoso/devicelogin', { otc: device.user_code, login: 'bob@contoso.com' });
  assert.equal(r.status, 200);
  r = await poll();
  assert.equal(r.status, 200);
  assert.equal(claims((await r.json()).id_token).preferred_username, 'bob@contoso.com');

  // Google: refresh tokens only offline, never rotated; its error shapes.
  const g = pkce();
  const gpage = await fetch(`${url}/o/oauth2/v2/auth?${new URLSearchParams({
    client_id: GOOGLE_CLIENT_ID, redirect_uri: redirect, response_type: 'code', scope: `${CLOUD_PLATFORM} openid email`,
    code_challenge: g.challenge, code_challenge_method: 'S256', state: 's2', access_type: 'offline', prompt: 'consent',
  })}`);
  const gctx = /name="ctx" value="([^"]+)"/.exec(await gpage.text())[1];
  const chosen = await form('/o/oauth2/v2/auth/choose', { ctx: gctx, email: 'carol@acme.example' });
  const gback = new URL(chosen.headers.get('location'));
  assert.equal(gback.searchParams.get('state'), 's2');
  const gcode = gback.searchParams.get('code');
  const gredeem = (params) => form('/token', { grant_type: 'authorization_code', code: gcode, redirect_uri: redirect, code_verifier: g.verifier, client_id: GOOGLE_CLIENT_ID, client_secret: GOOGLE_SECRET, ...params });
  r = await gredeem({ client_secret: 'wrong' });
  assert.deepEqual([r.status, await r.json()], [401, { error: 'invalid_client', error_description: 'Unauthorized' }]);
  r = await gredeem({ code_verifier: pkce().verifier });
  assert.deepEqual([r.status, await r.json()], [400, { error: 'invalid_grant', error_description: 'Invalid code verifier.' }]);
  r = await gredeem({ redirect_uri: 'http://127.0.0.1:9/other' });
  assert.equal((await r.json()).error, 'redirect_uri_mismatch');
  r = await gredeem({});
  const gt = await r.json();
  assert.match(gt.access_token, /^ya29\./);
  assert.match(gt.refresh_token, /^1\/\//);
  assert.equal(claims(gt.id_token).email, 'carol@acme.example');
  r = await gredeem({});
  assert.deepEqual(await r.json(), { error: 'invalid_grant', error_description: 'Malformed auth code.' });
  r = await form('/token', { grant_type: 'refresh_token', refresh_token: gt.refresh_token, client_id: GOOGLE_CLIENT_ID, client_secret: GOOGLE_SECRET });
  const grefreshed = await r.json();
  assert.equal(r.status, 200);
  assert.equal(grefreshed.refresh_token, undefined, 'Google does not rotate');
  await accounts.revoke('google', 'carol@acme.example');
  r = await form('/token', { grant_type: 'refresh_token', refresh_token: gt.refresh_token, client_id: GOOGLE_CLIENT_ID, client_secret: GOOGLE_SECRET });
  assert.deepEqual([r.status, await r.json()], [400, { error: 'invalid_grant', error_description: 'Token has been expired or revoked.' }]);

  // ChatGPT: JSON device endpoints, a string interval, 403/404 while pending, a JSON-only refresh.
  r = await form('/api/accounts/deviceauth/usercode', { client_id: CODEX_CLIENT_ID });
  assert.equal(r.status, 400, 'the user-code endpoint takes JSON only');
  r = await jsonPost('/api/accounts/deviceauth/usercode', { client_id: CODEX_CLIENT_ID });
  const uc = await r.json();
  assert.equal(uc.interval, '2');
  assert.match(uc.user_code, /^[A-Z]{4}-\d{4}$/);
  const cpoll = () => jsonPost('/api/accounts/deviceauth/token', { device_auth_id: uc.device_auth_id, user_code: uc.user_code });
  assert.deepEqual([(await cpoll()).status, (await cpoll()).status], [403, 404]);
  await form('/codex/device', { user_code: uc.user_code, email: 'dave@example.org' });
  r = await cpoll();
  const approved = await r.json();
  assert.deepEqual(Object.keys(approved).sort(), ['authorization_code', 'code_challenge', 'code_verifier']);
  const credeem = (params) => form('/oauth/token', { grant_type: 'authorization_code', code: approved.authorization_code, redirect_uri: `${url}/deviceauth/callback`, client_id: CODEX_CLIENT_ID, code_verifier: approved.code_verifier, ...params });
  r = await credeem({ redirect_uri: 'http://localhost:1455/auth/callback' });
  assert.equal(r.status, 400, 'the device flow redeems for ISSUER/deviceauth/callback only');
  r = await credeem({});
  const ct = await r.json();
  assert.equal(r.status, 200);
  assert.equal(claims(ct.access_token)['https://api.openai.com/auth'].chatgpt_plan_type, 'plus');
  r = await form('/oauth/token', { grant_type: 'refresh_token', refresh_token: ct.refresh_token, client_id: CODEX_CLIENT_ID });
  assert.deepEqual([r.status, (await r.json()).error.code], [400, 'invalid_request'], 'a form refresh is refused');
  const crefresh = () => jsonPost('/oauth/token', { client_id: CODEX_CLIENT_ID, grant_type: 'refresh_token', refresh_token: ct.refresh_token, scope: 'openid profile email' });
  assert.equal((await crefresh()).status, 200);
  r = await crefresh();
  assert.deepEqual([r.status, (await r.json()).error.code], [401, 'refresh_token_reused']);
});

// -- Microsoft Entra ID: authorization code + PKCE -----------------------------------------------

const ALICE = 'alice@contoso.com';
const AZURE_ALICE = `azure:${ALICE}`;

// Entra's access tokens live 16 s at the login and 12 s after, rota refreshes 10 s before expiry:
// the first refresh is due 6 s after the login, each next one 2 s after the one before.
e2e('Sign in with Microsoft: authorization code + PKCE, a rotated refresh token, a revoked one needs re-login', withAccounts({ lead: '10s' }), async (t, env) => {
  const { rota, accounts, upstream } = env;
  await accounts.configure({ entra_ttl: 16 });
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const azure = card(page, 'azure');
  assert.deepEqual(await labels(azure), ['Sign in with Microsoft', 'Sign in with Microsoft with a device code', 'Paste URL', 'Paste a client secret', 'Add key or token']);
  assert.equal(await azure.locator('.actions [data-action="add-account"]').getAttribute('class'), 'primary', 'the browser sign-in comes first');
  await docShot(page, 'add-account-microsoft', { target: azure });

  const authorize = await startBrowserSignIn(page, azure, accounts);
  assert.equal(authorize.pathname, '/contoso/oauth2/v2.0/authorize');
  assert.equal(authorize.searchParams.get('redirect_uri'), `${rota.url}/oauth/callback`);
  assert.deepEqual(authorize.searchParams.get('scope').split(' ').sort(), [COGNITIVE, 'offline_access', 'openid', 'profile'].sort());
  assert.equal(await page.title(), 'Sign in to your account');
  await page.locator('#entra-user').fill(ALICE);
  await shot(page, 'signins-entra-page');
  await page.locator('#entra-next').click();
  await page.waitForURL((u) => u.href.startsWith(`${rota.url}/ui/`));
  await page.locator('#view-profiles .notice', { hasText: `Logged in ${AZURE_ALICE}` }).waitFor();
  const alice = row(page, AZURE_ALICE);
  await alice.waitFor();
  assert.equal((await alice.locator('.type').innerText()).trim(), 'oauth');
  assert.equal((await alice.locator('.email').innerText()).trim(), ALICE, 'named from preferred_username (Entra sends no email claim)');
  assert.match((await alice.locator('.expires').innerText()).trim(), /^in \d/);
  const login = await accounts.latest('entra', ALICE, 'authorization_code');
  assert.equal(login.expires_in, 16);
  await assertNoSecrets(page, { 'the client secret': ENTRA_SECRET, 'the refresh token': login.refresh_token, 'the access token': login.access_token });

  // The gateway calls with Entra's access token.
  let r = await chat(rota, AZURE_MODEL, AZURE_ALICE);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.headers.get('x-rota-profile'), AZURE_ALICE);
  let seen = (await upstream.seen()).at(-1);
  assert.deepEqual([seen.path, seen.model], ['/v1/chat/completions', 'gpt-4.1']);
  t.diagnostic(`first gateway call ${seen.at - login.at} ms after the login`);
  if (seen.at < login.at + 6_000) assert.equal(seen.authorization, `Bearer ${login.access_token}`, "the login's access token");

  // Two refreshes, the second with the refresh token the first returned (the fake refuses any
  // other: each refresh spends the token presented).
  await accounts.configure({ entra_ttl: 12 });
  await sleepUntil(login.at + 6_500);
  r = await chat(rota, AZURE_MODEL, AZURE_ALICE);
  assert.equal(r.status, 200, r.text);
  const first = await waitUntil(async () => accounts.latest('entra', ALICE, 'refresh_token'), { message: 'the first refresh' });
  await sleepUntil(first.at + 5_500); // rota refreshes at most once per half its lead
  r = await chat(rota, AZURE_MODEL, AZURE_ALICE);
  assert.equal(r.status, 200, r.text);
  const grants = (await accounts.issued()).filter((i) => i.idp === 'entra' && i.account === ALICE);
  const refreshes = grants.filter((i) => i.grant_type === 'refresh_token');
  assert.ok(refreshes.length >= 2, `two refreshes at least, got ${refreshes.length}`);
  grants.slice(1).forEach((g, i) => assert.equal(g.presented, grants[i].refresh_token, `refresh ${i + 1} spent the refresh token the grant before it returned`));
  assert.equal(await accounts.failed('entra invalid_grant'), 0, 'no refresh was refused');
  seen = (await upstream.seen()).at(-1);
  const newest = await newestBefore(accounts, 'entra', ALICE, seen.at);
  assert.equal(newest.grant_type, 'refresh_token');
  assert.equal(seen.authorization, `Bearer ${newest.access_token}`, 'the upstream saw the newest access token');
  t.diagnostic(`${refreshes.length} refreshes in ${((Date.now() - login.at) / 1000).toFixed(1)} s`);

  // Revoked at Entra: the next refresh is refused and the profile needs a re-login.
  const { revoked } = await accounts.revoke('entra', ALICE);
  assert.equal(revoked, 1, 'one live refresh token');
  const last = (await accounts.issued()).filter((i) => i.idp === 'entra' && i.account === ALICE).at(-1);
  await sleepUntil(last.at + 2_500);
  r = await chat(rota, AZURE_MODEL, AZURE_ALICE);
  t.diagnostic(`gateway answer during the refused refresh: ${r.status}`);
  const p = await rota.waitProfile(AZURE_ALICE, (x) => x.status.state === 'disabled', 15_000);
  assert.equal(p.status.reason, 'auth_permanent');
  assert.match(p.status_text, /needs re-login/);
  assert.ok(await accounts.failed('entra invalid_grant AADSTS50173') >= 1, 'rota presented the revoked token');
  await page.reload();
  await page.locator('#tab-profiles').click();
  await waitUntil(async () => (await alice.locator('[data-action="relogin"].primary').count()) === 1, { message: 'Re-login is the primary action' });
  assert.match(await alice.locator('.state').innerText(), /needs re-login/);
});

// -- Microsoft Entra ID: device code -------------------------------------------------------------

e2e('Sign in with Microsoft with a device code: the code entered at Entra adds the account', withAccounts(), async (t, env) => {
  const { rota, accounts, upstream } = env;
  const BOB = 'bob@contoso.com';
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const azure = card(page, 'azure');
  await azure.locator('.actions [data-action="device-login"]').click();
  const codeEl = page.locator('#device-code');
  await codeEl.waitFor();
  const userCode = (await codeEl.innerText()).trim();
  assert.match(userCode, /^[A-Z0-9]{9}$/);
  const link = await page.locator('a#device-link').getAttribute('href');
  assert.equal(link, `${accounts.url}/contoso/devicelogin`);
  await docShot(page, 'add-account-microsoft-device', { target: azure });

  // rota polls Entra, which answers authorization_pending until the person approves.
  await waitUntil(async () => (await accounts.failed('entra authorization_pending AADSTS70016')) >= 1, { message: 'a pending poll', deadlineMs: 10_000 });
  const second = await page.context().newPage();
  await second.goto(link);
  assert.equal(await second.title(), 'Enter code');
  await second.locator('#entra-code').fill('AAAAAAAAA');
  await second.locator('#entra-user').fill(BOB);
  await second.locator('#entra-next').click();
  await second.locator('#entra-error').waitFor();
  await second.locator('#entra-code').fill(userCode);
  await second.locator('#entra-user').fill(BOB);
  await second.locator('#entra-next').click();
  await second.locator('#entra-done').waitFor();
  await second.close();

  const bob = row(page, `azure:${BOB}`);
  await bob.waitFor({ timeout: 20_000 });
  assert.equal((await bob.locator('.type').innerText()).trim(), 'oauth');
  const granted = await accounts.latest('entra', BOB, 'urn:ietf:params:oauth:grant-type:device_code');
  assert.ok(granted, 'Entra granted the device code');
  const pending = await accounts.failed('entra authorization_pending');
  assert.ok(pending >= 1, `polls answered authorization_pending before the grant: ${pending}`);
  await assertNoSecrets(page, { 'the client secret': ENTRA_SECRET, 'the refresh token': granted.refresh_token });

  const r = await chat(rota, AZURE_MODEL, `azure:${BOB}`);
  assert.equal(r.status, 200, r.text);
  assert.equal((await upstream.seen()).at(-1).authorization, `Bearer ${granted.access_token}`);

  const asked = (await accounts.requests()).filter((q) => q.path === '/contoso/oauth2/v2.0/devicecode');
  assert.equal(asked.length, 1);
  assert.ok(asked[0].params.includes('client_id'), `the devicecode request's body names the client: ${asked[0].params.join(', ')}`);
});

// -- Google (Vertex AI) --------------------------------------------------------------------------

const CAROL = 'carol@acme.example';

// Google's access tokens live 12 s here, rota's lead is 10 s: a refresh is due 2 s after each
// grant, and Google's answers carry no new refresh token.
e2e('Sign in with Google: authorization code + PKCE for Vertex AI, a refresh token kept; a service-account key', withAccounts({ lead: '10s' }), async (t, env) => {
  const { rota, accounts, upstream } = env;
  await accounts.configure({ google_ttl: 12 });
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const vertex = card(page, 'vertex');
  assert.deepEqual(await labels(vertex), ['Sign in with Google', 'Paste URL', 'Upload a service-account key', 'Add key or token']);
  assert.equal(await vertex.locator('[data-action="device-login"]').count(), 0, "no device code: Google's does not grant cloud-platform");
  await docShot(page, 'add-account-google', { target: vertex });

  const authorize = await startBrowserSignIn(page, vertex, accounts);
  assert.equal(authorize.pathname, '/o/oauth2/v2/auth');
  assert.equal(authorize.searchParams.get('access_type'), 'offline');
  assert.equal(authorize.searchParams.get('prompt'), 'consent');
  assert.deepEqual(authorize.searchParams.get('scope').split(' ').sort(), [CLOUD_PLATFORM, 'email', 'openid'].sort());
  assert.equal(await page.title(), 'Sign in - Google Accounts');
  await page.locator('#google-user').fill(CAROL);
  await page.locator('#google-continue').click();
  await page.waitForURL((u) => u.href.startsWith(`${rota.url}/ui/`));
  const carol = row(page, `vertex:${CAROL}`);
  await carol.waitFor();
  assert.equal((await carol.locator('.type').innerText()).trim(), 'oauth');
  const login = await accounts.latest('google', CAROL, 'authorization_code');
  assert.match(login.refresh_token, /^1\/\//, 'offline access: a refresh token');
  await assertNoSecrets(page, { 'the client secret': GOOGLE_SECRET, 'the refresh token': login.refresh_token });

  // A request inside each lead window: each refresh presents the login's refresh token again.
  await sleepUntil(login.at + 2_500);
  let r = await chat(rota, VERTEX_MODEL, `vertex:${CAROL}`);
  assert.equal(r.status, 200, r.text);
  const first = await waitUntil(async () => accounts.latest('google', CAROL, 'refresh_token'), { message: 'a refresh' });
  await sleepUntil(first.at + 5_500); // rota refreshes at most once per half its lead
  r = await chat(rota, VERTEX_MODEL, `vertex:${CAROL}`);
  assert.equal(r.status, 200, r.text);
  const refreshes = (await accounts.issued()).filter((i) => i.idp === 'google' && i.grant_type === 'refresh_token');
  assert.ok(refreshes.length >= 2, `two refreshes at least, got ${refreshes.length}`);
  assert.ok(refreshes.every((g) => g.presented === login.refresh_token && g.refresh_token === null), 'every refresh presented the login\'s refresh token');
  assert.equal(await accounts.failed('google'), 0, 'Google refused nothing');
  const seen = (await upstream.seen()).at(-1);
  assert.deepEqual([seen.path, seen.model], ['/v1/chat/completions', 'google/gemini-2.5-flash']);
  const newest = await newestBefore(accounts, 'google', CAROL, seen.at);
  assert.match(newest.access_token, /^ya29\./);
  assert.equal(seen.authorization, `Bearer ${newest.access_token}`);

  // A service account's key: the form as the card opens it, then the profile it adds.
  await vertex.locator('.actions [data-action="add-service-account"]').click();
  assert.equal(await vertex.locator('#key-type').inputValue(), 'service_account');
  assert.equal((await vertex.locator('label[for="key-file"]').innerText()).trim(), 'Key file');
  const pem = readFileSync(new URL('../fixtures/service-accounts/a.pem', import.meta.url), 'utf8');
  const email = 'rota-vertex@acme-ml.iam.gserviceaccount.com';
  const key = JSON.stringify({ type: 'service_account', project_id: 'acme-ml', private_key_id: 'k1', private_key: pem, client_email: email, token_uri: `${upstream.url}/token` });
  await vertex.locator('#key-file').setInputFiles({ name: 'acme-ml-key.json', mimeType: 'application/json', buffer: Buffer.from(key) });
  await waitUntil(async () => (await vertex.locator('#key-name').inputValue()) === email, { message: 'named from the key' });
  await docShot(page, 'add-account-service-account', { target: vertex });
  await vertex.locator('#key-submit').click();
  const sa = row(page, `vertex:${email}`);
  await sa.waitFor();
  assert.equal((await sa.locator('.type').innerText()).trim(), 'service_account');
  r = await chat(rota, VERTEX_MODEL, `vertex:${email}`);
  assert.equal(r.status, 200, r.text);
  const saTokens = await (await fetch(`${upstream.url}/__issued`)).json();
  assert.equal((await upstream.seen()).at(-1).authorization, `Bearer ${saTokens.at(-1)}`);
  assert.ok(!(await page.content()).includes('PRIVATE KEY'), 'the key is not in the page');
});

// -- ChatGPT (the Codex CLI's device sign-in) ----------------------------------------------------

// ChatGPT's access tokens live 12 s here, rota's lead is 10 s: a refresh (as JSON, rotating the
// refresh token) is due 2 s after each grant.
e2e('Sign in with ChatGPT with a device code: the Codex CLI\'s flow, the Codex backend, JSON refreshes', withAccounts({ lead: '10s' }), async (t, env) => {
  const { rota, accounts, upstream } = env;
  const DAVE = 'dave@example.org';
  await accounts.configure({ chatgpt_ttl: 12 });
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const chatgpt = card(page, 'chatgpt');
  assert.deepEqual(await labels(chatgpt), ['Sign in with ChatGPT', 'Sign in with ChatGPT with a device code', 'Add a token']);
  await chatgpt.locator('.actions [data-action="device-login"]').click();
  const codeEl = page.locator('#device-code');
  await codeEl.waitFor();
  const userCode = (await codeEl.innerText()).trim();
  assert.match(userCode, /^[A-Z]{4}-\d{4}$/);
  const link = await page.locator('a#device-link').getAttribute('href');
  assert.equal(link, `${accounts.url}/codex/device`);
  await docShot(page, 'add-account-chatgpt-device', { target: chatgpt });

  // rota polls every 2 s (the interval, sent as a string); pending answers 403, then 404.
  await waitUntil(async () => (await accounts.failed('chatgpt pending 403')) >= 1 && (await accounts.failed('chatgpt pending 404')) >= 1,
    { message: 'pending polls answered 403 and 404', deadlineMs: 15_000 });
  const second = await page.context().newPage();
  await second.goto(link);
  await second.locator('#chatgpt-code').fill(userCode);
  await second.locator('#chatgpt-user').fill(DAVE);
  await second.locator('#chatgpt-continue').click();
  await second.locator('#chatgpt-done').waitFor();
  await second.close();

  const dave = row(page, `chatgpt:${DAVE}`);
  await dave.waitFor({ timeout: 20_000 });
  assert.equal((await dave.locator('.type').innerText()).trim(), 'oauth');
  const granted = await accounts.latest('chatgpt', DAVE, 'authorization_code');
  assert.ok(granted, 'the authorization code was redeemed at ISSUER/oauth/token');
  assert.equal(await accounts.failed('chatgpt invalid'), 0, 'no refused redemption');
  await assertNoSecrets(page, { 'the refresh token': granted.refresh_token, 'the access token': granted.access_token });

  const asked = await accounts.requests();
  const usercode = asked.find((q) => q.path === '/api/accounts/deviceauth/usercode');
  assert.deepEqual([usercode.content_type, usercode.params], ['application/json', ['client_id']]);
  const redeemed = asked.find((q) => q.path === '/oauth/token');
  assert.match(redeemed.content_type, /^application\/x-www-form-urlencoded/);
  assert.deepEqual(redeemed.params.sort(), ['client_id', 'code', 'code_verifier', 'grant_type', 'redirect_uri']);

  // A plain (not streamed) chat completion through the Codex backend's Responses stream, with
  // the newest access token and its account's header; then refreshes until two were made.
  const account = claims(granted.access_token)['https://api.openai.com/auth'].chatgpt_account_id;
  for (let round = 0; ; round += 1) {
    const r = await chat(rota, CODEX_MODEL, `chatgpt:${DAVE}`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, 'hello from codex');
    const seen = (await upstream.seen()).at(-1);
    assert.deepEqual([seen.path, seen.status, seen.model, seen.account_id], ['/codex/responses', 200, 'gpt-5-codex', account]);
    const newest = await newestBefore(accounts, 'chatgpt', DAVE, seen.at);
    assert.equal(seen.authorization, `Bearer ${newest.access_token}`, 'the newest access token went upstream');
    const grants = (await accounts.issued()).filter((i) => i.idp === 'chatgpt');
    if (grants.length >= 3 || round === 4) break;
    await sleepUntil(grants.at(-1).at + 5_500); // at most once per half the lead
  }
  const grants = (await accounts.issued()).filter((i) => i.idp === 'chatgpt');
  assert.ok(grants.length >= 3, `two refreshes at least: ${grants.map((g) => g.grant_type)}`);
  grants.slice(1).forEach((g, i) => assert.equal(g.presented, grants[i].refresh_token, `refresh ${i + 1} spent the refresh token the grant before it returned`));
  assert.equal(await accounts.failed('chatgpt refresh_token'), 0, 'no refresh token refused');
  const refreshes = (await accounts.requests()).filter((q) => q.path === '/oauth/token').slice(1);
  assert.ok(refreshes.every((q) => q.content_type === 'application/json'), 'every refresh is JSON');
  assert.deepEqual(refreshes[0].params.sort(), ['client_id', 'grant_type', 'refresh_token', 'scope']);
});

// -- a client secret (Entra ID service principal) ------------------------------------------------

e2e('Paste a client secret: an Entra app\'s client credentials, exchanged by rota', withAccounts(), async (t, env) => {
  const { rota, accounts, upstream } = env;
  const page = await newPage(env.browser);
  await signIn(page, rota);
  const azure = card(page, 'azure');
  await azure.locator('.actions [data-action="add-client"]').click();
  assert.equal(await azure.locator('#key-type').inputValue(), 'client_credentials');
  assert.equal((await azure.locator('label[for="key-name"]').innerText()).trim(), 'Client ID');
  await azure.locator('#key-name').fill(ENTRA_CLIENT_ID);
  await azure.locator('#key-secret').fill(ENTRA_SECRET);
  await docShot(page, 'add-account-client-secret', { target: azure });
  await azure.locator('#key-submit').click();
  const app = row(page, `azure:${ENTRA_CLIENT_ID}`);
  await app.waitFor();
  assert.equal((await app.locator('.type').innerText()).trim(), 'client_credentials');
  await assertNoSecrets(page, { 'the client secret': ENTRA_SECRET });

  const r = await chat(rota, AZURE_MODEL, `azure:${ENTRA_CLIENT_ID}`);
  assert.equal(r.status, 200, r.text);
  const granted = (await accounts.issued()).filter((i) => i.grant_type === 'client_credentials');
  assert.equal(granted.length, 1, 'one exchange at Entra');
  assert.equal(granted[0].refresh_token, null);
  assert.equal(claims(granted[0].access_token).appid, ENTRA_CLIENT_ID);
  assert.equal((await upstream.seen()).at(-1).authorization, `Bearer ${granted[0].access_token}`);
  assert.equal(await accounts.failed('entra'), 0, 'Entra refused nothing');
});
