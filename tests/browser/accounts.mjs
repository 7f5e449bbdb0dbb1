#!/usr/bin/env node
// Three identity providers as rota meets them, faked on 127.0.0.1 for the sign-in tests
// (signins.test.mjs). Each one ENFORCES its provider's documented protocol, with its provider's
// error shapes, so a request rota gets wrong is refused here as it would be there:
//
//   node accounts.mjs [--port P] [--redirect URI]…
//
// prints {"url": "http://127.0.0.1:P"} on stdout once it listens. --redirect (repeatable): the
// redirect URIs registered for the Entra app and the Google client (exact match, as both do).
//
// Microsoft Entra ID v2 (TENANT: any string), app `rota-entra-app`, secret `entra-secret-0001`:
//   GET  /TENANT/oauth2/v2.0/authorize   sign-in page (#entra-user, #entra-next) -> 302
//                                        redirect_uri?code&state&session_state
//   POST /TENANT/oauth2/v2.0/token       authorization_code (PKCE S256), refresh_token (rotated:
//                                        see refreshEntra), device_code, client_credentials
//   POST /TENANT/oauth2/v2.0/devicecode  {user_code, device_code, verification_uri, …}
//   GET  /TENANT/devicelogin             code page (#entra-code, #entra-user, #entra-next)
// Google OAuth 2.0, web client `rota-google.apps.googleusercontent.com`, secret `google-secret-0001`:
//   GET  /o/oauth2/v2/auth               account chooser (#google-user, #google-continue)
//   POST /token                          authorization_code (PKCE S256), refresh_token (not rotated)
// ChatGPT sign-in as the Codex CLI does it (issuer: this server's root), client
// `app_EMoamEEZ73f0CkXaXp7hrann`:
//   POST /api/accounts/deviceauth/usercode   JSON {client_id} -> {device_auth_id, user_code, interval: "2"}
//   POST /api/accounts/deviceauth/token      JSON {device_auth_id, user_code}: 403 and 404 in turn
//                                            while pending; then {authorization_code, code_challenge,
//                                            code_verifier}
//   GET  /codex/device                       code page (#chatgpt-code, #chatgpt-user, #chatgpt-continue)
//   POST /oauth/token                        form authorization_code (redirect ISSUER/deviceauth/callback);
//                                            JSON refresh_token (rotated; a spent one -> 401
//                                            refresh_token_reused, a revoked one refresh_token_invalidated)
//
// Client authentication at the token endpoints: in the form body (client_secret_post) or HTTP
// Basic (client_secret_basic, id and secret form-urlencoded first, RFC 6749 §2.3.1): Entra's
// and Google's discovery documents list both.
//
// Test control API:
//   GET  /__issued        every token response granted, oldest first: [{idp, grant_type, account,
//                         client_id, access_token, refresh_token, presented (the refresh token a
//                         refresh grant spent), expires_in, at}]
//   GET  /__failures      refusals by "<idp> <error>" (Entra's with its AADSTS code appended, e.g.
//                         "entra authorization_pending AADSTS70016"; ChatGPT's pending polls as
//                         "chatgpt pending 403" / "chatgpt pending 404") -> {key: count}
//   GET  /__requests      every request to a token, device or user-code endpoint, oldest first:
//                         [{path, content_type, client_auth: "basic" | "body" | "none", params: [names]}]
//                         (parameter names only, never values)
//   POST /__revoke?idp=entra|google|chatgpt&account=EMAIL   revokes that account's refresh tokens
//                         -> {revoked: n}
//   POST /__config {entra_ttl?, google_ttl?, chatgpt_ttl?}
//                         access-token lifetimes (s) from now on

import { createHash, randomBytes, randomUUID } from 'node:crypto';
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values: argv } = parseArgs({
  options: { port: { type: 'string', default: '0' }, redirect: { type: 'string', multiple: true, default: [] } },
});

const ENTRA_APP = { id: 'rota-entra-app', secret: 'entra-secret-0001', name: 'rota' };
const GOOGLE_CLIENT = { id: 'rota-google.apps.googleusercontent.com', secret: 'google-secret-0001' };
const CODEX_CLIENT = 'app_EMoamEEZ73f0CkXaXp7hrann';
const COGNITIVE = 'https://cognitiveservices.azure.com/.default';
const CLOUD_PLATFORM = 'https://www.googleapis.com/auth/cloud-platform';
const redirects = new Set(argv.redirect);

const config = { entra_ttl: 3600, google_ttl: 3599, chatgpt_ttl: 3600 };
const issued = [];
const requests = [];
const failures = {};
let base = ''; // http://127.0.0.1:P, once listening

// -- helpers -------------------------------------------------------------------------------------

const now = () => Math.floor(Date.now() / 1000);
const random = (n = 32) => randomBytes(n).toString('base64url');
const b64url = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');
const s256 = (verifier) => createHash('sha256').update(verifier).digest('base64url');
/** A GUID derived from `seed`: stable per account (oid, tid, chatgpt_account_id). */
function guid(seed) {
  const h = createHash('sha256').update(seed).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-a${h.slice(17, 20)}-${h.slice(20, 32)}`;
}
/** A JWT as the providers shape theirs: RS256 header, claims, and a signature nobody checks. */
const jwt = (claims, kid = 'test-key') => `${b64url({ typ: 'JWT', alg: 'RS256', kid })}.${b64url(claims)}.${random(64)}`;
const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function fail(key) {
  failures[key] = (failures[key] ?? 0) + 1;
}

function json(res, status, value, headers = {}) {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

function html(res, status, title, body) {
  const page = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>
<style>body{font-family:sans-serif;max-width:28rem;margin:3rem auto}label,input,button{display:block;margin:.5rem 0}
input{width:100%;padding:.4rem}.error{color:#a4262c}</style></head><body>${body}</body></html>`;
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'content-length': Buffer.byteLength(page) });
  res.end(page);
}

function redirect(res, to) {
  res.writeHead(302, { location: to, 'content-length': 0 });
  res.end();
}

/** The request's body (read once; later calls get the same text). */
function readBody(req) {
  req.bodyText ??= (async () => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    return Buffer.concat(chunks).toString('utf8');
  })();
  return req.bodyText;
}

const isForm = (req) => String(req.headers['content-type'] ?? '').toLowerCase().startsWith('application/x-www-form-urlencoded');
const isJson = (req) => String(req.headers['content-type'] ?? '').toLowerCase().startsWith('application/json');

/** The form body as a Map; a parameter given twice is refused (null), as OAuth requires. */
function formOf(text) {
  const form = new Map();
  for (const [k, v] of new URLSearchParams(text)) {
    if (form.has(k)) return null;
    form.set(k, v);
  }
  return form;
}

/** The client's id and secret: HTTP Basic (each part form-urlencoded) or the form body. */
function clientOf(req, form) {
  const m = /^Basic\s+(.+)$/i.exec(req.headers.authorization ?? '');
  if (m) {
    const [id, secret] = Buffer.from(m[1], 'base64').toString('utf8').split(':');
    const dec = (s) => decodeURIComponent(String(s ?? '').replace(/\+/g, ' '));
    return { id: dec(id), secret: dec(secret), basic: true };
  }
  return { id: form.get('client_id'), secret: form.get('client_secret'), basic: false };
}

/** A PKCE verifier as RFC 7636 §4.1 allows, hashing (S256) to `challenge`. */
const pkceOk = (verifier, challenge) => typeof verifier === 'string' && /^[A-Za-z0-9._~-]{43,128}$/.test(verifier) && s256(verifier) === challenge;

function grant(idp, grantType, account, clientId, body, extra = {}) {
  issued.push({
    idp, grant_type: grantType, account, client_id: clientId,
    access_token: body.access_token, refresh_token: body.refresh_token ?? null,
    presented: extra.presented ?? null, expires_in: body.expires_in ?? null, at: Date.now(),
  });
}

/** Every account signs in with its email; its ids are derived from it. */
const person = (email) => ({
  email,
  name: email.split('@')[0].replace(/^./, (c) => c.toUpperCase()),
  oid: guid(`oid ${email}`),
  chatgptAccountId: guid(`chatgpt ${email}`),
});

// -- Microsoft Entra ID v2 -----------------------------------------------------------------------
// https://learn.microsoft.com/entra/identity-platform/v2-oauth2-auth-code-flow, …-device-code,
// …-client-creds-grant-flow; errors as https://learn.microsoft.com/entra/identity-platform/reference-error-codes.

const entra = {
  pending: new Map(), // ctx -> the authorize request awaiting its sign-in
  codes: new Map(), // code -> {client_id, redirect_uri, challenge, scope, account, tenant, used, exp}
  refresh: new Map(), // refresh token -> {account, client_id, scope, tenant, live}
  devices: new Map(), // device_code -> {user_code, client_id, scope, tenant, exp, account}
};

const AADSTS = {
  50011: (p) => `The redirect URI '${p.uri}' specified in the request does not match the redirect URIs configured for the application '${ENTRA_APP.id}'. Make sure the redirect URI sent in the request matches one added to your application in the Azure portal.`,
  50173: () => 'The provided grant has expired due to it being revoked, a fresh auth token is needed. The user might have changed or reset their password. The grant was issued on \'2026-01-01T00:00:00.0000000Z\' and the TokensValidFrom date (before which tokens are not valid) for this user is \'2026-01-01T00:00:01.0000000Z\'.',
  54005: () => 'OAuth2 Authorization code was already redeemed, please retry with a new valid code or use an existing refresh token.',
  70003: (p) => `The app requested an unsupported grant type '${p.grant}'.`,
  70008: () => 'The provided authorization code or refresh token has expired due to inactivity. Send a new interactive authorization request for this user and resource.',
  70011: (p) => `The provided value for the input parameter 'scope' is not valid. ${p.why}`,
  70016: () => 'OAuth 2.0 device flow error. Authorization is pending. Continue polling.',
  70019: () => 'Verification code expired.',
  500112: (p) => `The reply address '${p.uri}' does not match the reply address '${p.want}' provided when requesting Authorization code.`,
  501481: () => 'The Code_Verifier does not match the code_challenge supplied in the authorization request for PKCE.',
  700016: (p) => `Application with identifier '${p.id}' was not found in the directory '${p.tenant}'. This can happen if the application has not been installed by the administrator of the tenant or consented to by any user in the tenant.`,
  7000215: () => `Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '${ENTRA_APP.id}'.`,
  7000218: () => 'The request body must contain the following parameter: \'client_assertion\' or \'client_secret\'.',
  900144: (p) => `The request body must contain the following parameter: '${p.name}'.`,
  9002325: () => 'Proof Key for Code Exchange is required for cross-origin authorization code redemption.',
};

const entraTimestamp = () => new Date().toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');

/** An Entra error answer: {error, error_description "AADSTSn: …\r\nTrace ID…", error_codes, …}. */
function entraError(res, status, error, code, params = {}) {
  fail(`entra ${error} AADSTS${code}`);
  const trace = randomUUID();
  const correlation = randomUUID();
  const timestamp = entraTimestamp();
  return json(res, status, {
    error,
    error_description: `AADSTS${code}: ${AADSTS[code](params)}\r\nTrace ID: ${trace}\r\nCorrelation ID: ${correlation}\r\nTimestamp: ${timestamp}`,
    error_codes: [code],
    timestamp,
    trace_id: trace,
    correlation_id: correlation,
    error_uri: `https://login.microsoftonline.com/error?code=${code}`,
  });
}

/** Entra's error page (what the browser shows when the request cannot be sent back). */
function entraErrorPage(res, code, params) {
  fail(`entra authorize AADSTS${code}`);
  return html(res, 400, 'Sign in to your account', `<h1>Sorry, but we’re having trouble signing you in.</h1>
<p id="entra-error" class="error">AADSTS${code}: ${escape(AADSTS[code](params))}</p>`);
}

const tenantId = (tenant) => guid(`tenant ${tenant}`);
const scopes = (s) => String(s ?? '').split(/\s+/).filter(Boolean);

/** The scope problem of a delegated Entra request (authorize, devicecode), or null. */
function entraScopeProblem(scope) {
  const list = scopes(scope);
  if (!list.includes(COGNITIVE)) return `The scope '${scope}' does not name the resource ${COGNITIVE}.`;
  if (!list.includes('offline_access')) return `The scope '${scope}' has no offline_access: no refresh token would be issued.`;
  return null;
}

/** Tokens for a person: access (a v1 JWT for Cognitive Services), refresh (offline_access), id_token (openid). */
function entraTokens({ account, client_id: clientId, scope, tenant }) {
  const p = person(account);
  const tid = tenantId(tenant);
  const iat = now();
  const ttl = config.entra_ttl;
  const list = scopes(scope);
  const body = {
    token_type: 'Bearer',
    scope: list.filter((s) => s !== 'offline_access').join(' '),
    expires_in: ttl,
    ext_expires_in: ttl,
    access_token: jwt({
      aud: 'https://cognitiveservices.azure.com', iss: `https://sts.windows.net/${tid}/`, iat, nbf: iat, exp: iat + ttl,
      appid: clientId, name: p.name, oid: p.oid, scp: 'user_impersonation', sub: random(32), tid, unique_name: account, upn: account, uti: random(16), ver: '1.0',
    }),
  };
  if (list.includes('offline_access')) {
    body.refresh_token = `1.A${random(96)}`;
    entra.refresh.set(body.refresh_token, { account, client_id: clientId, scope, tenant, live: true });
  }
  if (list.includes('openid')) {
    body.id_token = jwt({
      aud: clientId, iss: `https://login.microsoftonline.com/${tid}/v2.0`, iat, nbf: iat, exp: iat + 3600,
      name: p.name, oid: p.oid, preferred_username: account, sub: b64url(createHash('sha256').update(`${clientId} ${account}`).digest()).slice(0, 43),
      tid, ver: '2.0',
    });
  }
  return body;
}

/** GET authorize: checks the request as Entra does, then the sign-in page. */
function entraAuthorize(res, tenant, q) {
  const clientId = q.get('client_id');
  if (clientId !== ENTRA_APP.id) return entraErrorPage(res, 700016, { id: clientId, tenant });
  const redirectUri = q.get('redirect_uri');
  if (!redirects.has(redirectUri)) return entraErrorPage(res, 50011, { uri: redirectUri });
  // From here on Entra sends the error back to the redirect URI.
  const back = (error, code, params) => {
    fail(`entra ${error} AADSTS${code}`);
    const to = new URL(redirectUri);
    to.searchParams.set('error', error);
    to.searchParams.set('error_description', `AADSTS${code}: ${AADSTS[code](params)}`);
    if (q.get('state')) to.searchParams.set('state', q.get('state'));
    return redirect(res, to.href);
  };
  if (q.get('response_type') !== 'code') return back('unsupported_response_type', 70003, { grant: q.get('response_type') });
  const why = entraScopeProblem(q.get('scope'));
  if (why) return back('invalid_scope', 70011, { why });
  // Stricter than Entra, which asks PKCE of single-page apps only: rota always sends it.
  if (!q.get('code_challenge') || q.get('code_challenge_method') !== 'S256') return back('invalid_request', 9002325, {});
  if (!q.get('state')) return back('invalid_request', 900144, { name: 'state' });
  const ctx = random(24);
  entra.pending.set(ctx, { tenant, client_id: clientId, redirect_uri: redirectUri, scope: q.get('scope'), state: q.get('state'), challenge: q.get('code_challenge') });
  return entraSignInPage(res, tenant, ctx);
}

function entraSignInPage(res, tenant, ctx, error = '') {
  return html(res, error ? 400 : 200, 'Sign in to your account', `<h1>Sign in</h1>
${error ? `<p id="entra-error" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/${encodeURIComponent(tenant)}/login">
<input type="hidden" name="ctx" value="${escape(ctx)}">
<label for="entra-user">Email, phone, or Skype</label>
<input id="entra-user" name="login" type="email" autocomplete="username" required>
<button id="entra-next" type="submit">Next</button></form>`);
}

/** POST login (the sign-in page's form): a code for the account, back to the redirect URI. */
function entraLogin(res, tenant, form) {
  const ctx = form.get('ctx');
  const login = (form.get('login') ?? '').trim().toLowerCase();
  const pending = entra.pending.get(ctx);
  if (!pending) return html(res, 400, 'Sign in to your account', '<p id="entra-error" class="error">AADSTS90015: Requested query string is too long or the sign-in session expired. Start again.</p>');
  if (!/^[^@\s]+@[^@\s]+\.[^@\s]+$/.test(login)) return entraSignInPage(res, tenant, ctx, 'Enter a valid email address, phone number, or Skype name.');
  entra.pending.delete(ctx);
  const code = `1.A${random(120)}`;
  entra.codes.set(code, { ...pending, account: login, used: false, exp: Date.now() + 10 * 60_000 });
  const to = new URL(pending.redirect_uri);
  to.searchParams.set('code', code);
  to.searchParams.set('state', pending.state);
  to.searchParams.set('session_state', randomUUID());
  return redirect(res, to.href);
}

/** The device code page: a code and the account that approves it. */
function entraDevicePage(res, tenant, { error = '', done = false } = {}) {
  if (done) {
    return html(res, 200, 'Microsoft', `<h1 id="entra-done">You have signed in to the ${escape(ENTRA_APP.name)} application on your device.</h1><p>You may now close this window.</p>`);
  }
  return html(res, error ? 400 : 200, 'Enter code', `<h1>Enter code</h1>
<p>Enter the code displayed on your app or device.</p>
${error ? `<p id="entra-error" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/${encodeURIComponent(tenant)}/devicelogin">
<label for="entra-code">Code</label><input id="entra-code" name="otc" autocomplete="off" required>
<label for="entra-user">Email, phone, or Skype</label><input id="entra-user" name="login" type="email" required>
<button id="entra-next" type="submit">Next</button></form>`);
}

function entraDeviceApprove(res, tenant, form) {
  const userCode = (form.get('otc') ?? '').trim().toUpperCase();
  const login = (form.get('login') ?? '').trim().toLowerCase();
  const device = [...entra.devices.values()].find((d) => d.user_code === userCode && d.tenant === tenant);
  if (!device || device.exp <= Date.now()) {
    fail('entra devicelogin wrong_code');
    return entraDevicePage(res, tenant, { error: 'That code didn’t work. Check the code and try again.' });
  }
  if (!/^[^@\s]+@[^@\s]+\.[^@\s]+$/.test(login)) return entraDevicePage(res, tenant, { error: 'Enter a valid email address, phone number, or Skype name.' });
  device.account = login;
  return entraDevicePage(res, tenant, { done: true });
}

/** POST devicecode: client_id and scope in the form body, as Microsoft documents the request. */
function entraDeviceCode(req, res, tenant, form) {
  const clientId = form.get('client_id');
  if (!clientId) return entraError(res, 400, 'invalid_request', 900144, { name: 'client_id' });
  if (clientId !== ENTRA_APP.id) return entraError(res, 400, 'unauthorized_client', 700016, { id: clientId, tenant });
  if (!form.get('scope')) return entraError(res, 400, 'invalid_request', 900144, { name: 'scope' });
  const why = entraScopeProblem(form.get('scope'));
  if (why) return entraError(res, 400, 'invalid_scope', 70011, { why });
  const letters = 'ABCDEFGHJKLMNPQRSTUVWXYZ23456789';
  const userCode = Array.from(randomBytes(9), (b) => letters[b % letters.length]).join('');
  const deviceCode = `DAQABAAEAAA${random(96)}`;
  entra.devices.set(deviceCode, { user_code: userCode, client_id: ENTRA_APP.id, scope: form.get('scope'), tenant, exp: Date.now() + 900_000, account: null });
  const uri = `${base}/${encodeURIComponent(tenant)}/devicelogin`;
  return json(res, 200, {
    user_code: userCode,
    device_code: deviceCode,
    verification_uri: uri,
    expires_in: 900,
    interval: 2,
    message: `To sign in, use a web browser to open the page ${uri} and enter the code ${userCode} to authenticate.`,
  });
}

/** The confidential client's credentials; null (the error answer sent) when they are not right. */
function entraClient(req, res, form, tenant, { secretRequired = true } = {}) {
  const client = clientOf(req, form);
  const refuse = (...args) => {
    entraError(res, ...args);
    return null;
  };
  if (!client.id) return refuse(400, 'invalid_request', 900144, { name: 'client_id' });
  if (client.id !== ENTRA_APP.id) return refuse(400, 'unauthorized_client', 700016, { id: client.id, tenant });
  if (!client.secret) return secretRequired ? refuse(401, 'invalid_client', 7000218) : client;
  if (client.secret !== ENTRA_APP.secret) return refuse(401, 'invalid_client', 7000215);
  return client;
}

async function entraToken(req, res, tenant) {
  const text = await readBody(req);
  // Entra reads only form bodies: anything else has no grant_type.
  const form = isForm(req) ? formOf(text) : new Map();
  if (!form) return entraError(res, 400, 'invalid_request', 900144, { name: 'a parameter given once' });
  const grantType = form.get('grant_type');
  if (!grantType) return entraError(res, 400, 'invalid_request', 900144, { name: 'grant_type' });
  switch (grantType) {
    case 'authorization_code': {
      if (!entraClient(req, res, form, tenant)) return;
      const code = form.get('code');
      if (!code) return entraError(res, 400, 'invalid_request', 900144, { name: 'code' });
      const c = entra.codes.get(code);
      if (!c || c.tenant !== tenant || c.exp <= Date.now()) return entraError(res, 400, 'invalid_grant', 70008);
      if (c.used) return entraError(res, 400, 'invalid_grant', 54005);
      if (!form.get('redirect_uri')) return entraError(res, 400, 'invalid_request', 900144, { name: 'redirect_uri' });
      if (form.get('redirect_uri') !== c.redirect_uri) return entraError(res, 400, 'invalid_grant', 500112, { uri: form.get('redirect_uri'), want: c.redirect_uri });
      if (!pkceOk(form.get('code_verifier'), c.challenge)) return entraError(res, 400, 'invalid_grant', 501481);
      c.used = true;
      const body = entraTokens(c);
      grant('entra', grantType, c.account, c.client_id, body);
      return json(res, 200, body);
    }
    case 'refresh_token':
      return refreshEntra(req, res, tenant, form);
    case 'urn:ietf:params:oauth:grant-type:device_code': {
      // A public-client flow: the secret is optional, but checked when sent.
      if (!entraClient(req, res, form, tenant, { secretRequired: false })) return;
      if (!form.get('device_code')) return entraError(res, 400, 'invalid_request', 900144, { name: 'device_code' });
      const d = entra.devices.get(form.get('device_code'));
      if (!d || d.tenant !== tenant) return entraError(res, 400, 'invalid_grant', 70008);
      if (d.exp <= Date.now()) return entraError(res, 400, 'expired_token', 70019);
      if (!d.account) return entraError(res, 400, 'authorization_pending', 70016);
      entra.devices.delete(form.get('device_code'));
      const body = entraTokens({ account: d.account, client_id: d.client_id, scope: d.scope, tenant });
      grant('entra', grantType, d.account, d.client_id, body);
      return json(res, 200, body);
    }
    case 'client_credentials': {
      // The secret in the form body, as Microsoft documents this grant.
      if (!entraClient(req, res, form, tenant)) return;
      if (!form.get('scope')) return entraError(res, 400, 'invalid_request', 900144, { name: 'scope' });
      if (form.get('scope') !== COGNITIVE) {
        return entraError(res, 400, 'invalid_scope', 70011, { why: `The scope ${form.get('scope')} is not valid: the client credentials flow takes one resource's /.default.` });
      }
      const iat = now();
      const tid = tenantId(tenant);
      const body = {
        token_type: 'Bearer',
        expires_in: config.entra_ttl,
        ext_expires_in: config.entra_ttl,
        access_token: jwt({
          aud: 'https://cognitiveservices.azure.com', iss: `https://sts.windows.net/${tid}/`, iat, nbf: iat, exp: iat + config.entra_ttl,
          appid: ENTRA_APP.id, idtyp: 'app', oid: guid(`sp ${ENTRA_APP.id}`), sub: guid(`sp ${ENTRA_APP.id}`), tid, uti: random(16), ver: '1.0',
        }),
      };
      grant('entra', grantType, ENTRA_APP.id, ENTRA_APP.id, body);
      return json(res, 200, body);
    }
    default:
      return entraError(res, 400, 'unsupported_grant_type', 70003, { grant: grantType });
  }
}

/**
 * The refresh_token grant. Every refresh answers a NEW refresh token and the one presented stops
 * working at once. Entra itself keeps the old one alive until it expires; this fake is stricter on
 * purpose: a rota that went on using the old token after a refresh is refused here, so a refresh
 * that succeeds proves rota stored the rotated one.
 */
function refreshEntra(req, res, tenant, form) {
  if (!entraClient(req, res, form, tenant)) return;
  const presented = form.get('refresh_token');
  if (!presented) return entraError(res, 400, 'invalid_request', 900144, { name: 'refresh_token' });
  const r = entra.refresh.get(presented);
  if (!r || !r.live || r.tenant !== tenant) return entraError(res, 400, 'invalid_grant', 50173);
  // The scope is optional on a refresh (Microsoft's docs, since 2023); when sent it may only narrow.
  if (form.get('scope') && !scopes(form.get('scope')).every((s) => scopes(r.scope).includes(s))) {
    return entraError(res, 400, 'invalid_scope', 70011, { why: 'A refresh may not ask for scopes the grant does not hold.' });
  }
  r.live = false;
  const body = entraTokens(r);
  grant('entra', 'refresh_token', r.account, r.client_id, body, { presented });
  return json(res, 200, body);
}

// -- Google OAuth 2.0 ----------------------------------------------------------------------------
// https://developers.google.com/identity/protocols/oauth2/web-server

const google = {
  pending: new Map(), // ctx -> the authorize request awaiting its account
  codes: new Map(), // code -> {redirect_uri, challenge, scope, account, offline, used, exp}
  refresh: new Map(), // refresh token -> {account, scope, live}
  consented: new Set(), // accounts that granted offline access before (no new refresh token without prompt=consent)
};

function googleError(res, status, error, description) {
  fail(`google ${error}`);
  return json(res, status, description === undefined ? { error } : { error, error_description: description });
}

function googleErrorPage(res, error, detail) {
  fail(`google authorize ${error}`);
  return html(res, 400, 'Error 400', `<h1>Access blocked: This app’s request is invalid</h1>
<p id="google-error" class="error">Error 400: ${escape(error)}</p><p>${escape(detail)}</p>`);
}

/** Google names the short scopes by their URLs in its answers. */
const googleScope = (scope) => scopes(scope).map((s) => ({ email: 'https://www.googleapis.com/auth/userinfo.email', profile: 'https://www.googleapis.com/auth/userinfo.profile' })[s] ?? s).join(' ');

function googleAuthorize(res, q) {
  if (q.get('client_id') !== GOOGLE_CLIENT.id) {
    fail('google authorize invalid_client');
    return html(res, 401, 'Error 401', '<h1>Access blocked: Authorization Error</h1><p id="google-error" class="error">Error 401: invalid_client</p><p>The OAuth client was not found.</p>');
  }
  const redirectUri = q.get('redirect_uri');
  if (!redirects.has(redirectUri)) return googleErrorPage(res, 'redirect_uri_mismatch', `You can’t sign in to this app because it doesn’t comply with Google’s OAuth 2.0 policy. redirect_uri=${redirectUri}`);
  if (q.get('response_type') !== 'code') return googleErrorPage(res, 'invalid_request', `Invalid response_type: ${q.get('response_type')}`);
  if (!q.get('scope')) return googleErrorPage(res, 'invalid_request', 'Missing required parameter: scope');
  if (!scopes(q.get('scope')).includes(CLOUD_PLATFORM)) return googleErrorPage(res, 'invalid_scope', `Vertex AI needs ${CLOUD_PLATFORM}`);
  // Stricter than Google, which leaves PKCE optional for web clients: rota always sends it.
  if (!q.get('code_challenge') || q.get('code_challenge_method') !== 'S256') return googleErrorPage(res, 'invalid_request', 'code_challenge_method must be S256, with a code_challenge');
  if (!q.get('state')) return googleErrorPage(res, 'invalid_request', 'Missing required parameter: state');
  const ctx = random(24);
  google.pending.set(ctx, {
    redirect_uri: redirectUri, scope: q.get('scope'), state: q.get('state'), challenge: q.get('code_challenge'),
    offline: q.get('access_type') === 'offline', consent: scopes(q.get('prompt')).includes('consent'),
  });
  return googleChooser(res, ctx);
}

function googleChooser(res, ctx, error = '') {
  return html(res, error ? 400 : 200, 'Sign in - Google Accounts', `<h1>Choose an account</h1><p>to continue to rota</p>
${error ? `<p id="google-error" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/o/oauth2/v2/auth/choose">
<input type="hidden" name="ctx" value="${escape(ctx)}">
<label for="google-user">Email or phone</label><input id="google-user" name="email" type="email" required>
<button id="google-continue" type="submit">Continue</button></form>`);
}

function googleChoose(res, form) {
  const pending = google.pending.get(form.get('ctx'));
  const email = (form.get('email') ?? '').trim().toLowerCase();
  if (!pending) return html(res, 400, 'Error 400', '<p id="google-error" class="error">This sign-in request expired. Start again.</p>');
  if (!/^[^@\s]+@[^@\s]+\.[^@\s]+$/.test(email)) return googleChooser(res, form.get('ctx'), 'Enter a valid email or phone number');
  google.pending.delete(form.get('ctx'));
  // A refresh token only with access_type=offline: on the first consent, or again with prompt=consent.
  const offline = pending.offline && (pending.consent || !google.consented.has(email));
  if (pending.offline) google.consented.add(email);
  const code = `4/0A${random(60)}`;
  google.codes.set(code, { ...pending, account: email, offline, used: false, exp: Date.now() + 10 * 60_000 });
  const to = new URL(pending.redirect_uri);
  to.searchParams.set('state', pending.state);
  to.searchParams.set('code', code);
  to.searchParams.set('scope', googleScope(pending.scope));
  to.searchParams.set('authuser', '0');
  to.searchParams.set('prompt', 'consent');
  return redirect(res, to.href);
}

function googleTokens({ account, scope }, withRefresh) {
  const iat = now();
  const body = {
    access_token: `ya29.a0${random(120)}`,
    expires_in: config.google_ttl,
    scope: googleScope(scope),
    token_type: 'Bearer',
  };
  if (withRefresh) {
    body.refresh_token = `1//0${random(72)}`;
    google.refresh.set(body.refresh_token, { account, scope, live: true });
  }
  if (scopes(scope).includes('openid')) {
    body.id_token = jwt({
      iss: 'https://accounts.google.com', azp: GOOGLE_CLIENT.id, aud: GOOGLE_CLIENT.id, sub: String(BigInt(`0x${createHash('sha256').update(account).digest('hex').slice(0, 15)}`)),
      email: account, email_verified: true, at_hash: random(16), iat, exp: iat + 3599,
    });
  }
  return body;
}

async function googleToken(req, res) {
  const text = await readBody(req);
  if (!isForm(req)) return googleError(res, 400, 'invalid_request', 'Invalid content type: the body must be application/x-www-form-urlencoded.');
  const form = formOf(text);
  if (!form) return googleError(res, 400, 'invalid_request', 'A parameter appears twice.');
  const grantType = form.get('grant_type');
  if (!['authorization_code', 'refresh_token'].includes(grantType)) return googleError(res, 400, 'unsupported_grant_type', `Invalid grant_type: ${grantType ?? ''}`);
  const client = clientOf(req, form);
  if (!client.id) return googleError(res, 400, 'invalid_request', 'Could not determine client ID from request.');
  if (client.id !== GOOGLE_CLIENT.id) return googleError(res, 401, 'invalid_client', 'The OAuth client was not found.');
  if (!client.secret) return googleError(res, 400, 'invalid_request', 'client_secret is missing.');
  if (client.secret !== GOOGLE_CLIENT.secret) return googleError(res, 401, 'invalid_client', 'Unauthorized');
  if (grantType === 'authorization_code') {
    const c = google.codes.get(form.get('code'));
    if (!c || c.used || c.exp <= Date.now()) return googleError(res, 400, 'invalid_grant', 'Malformed auth code.');
    if (!form.get('redirect_uri')) return googleError(res, 400, 'invalid_request', 'Missing parameter: redirect_uri');
    if (form.get('redirect_uri') !== c.redirect_uri) return googleError(res, 400, 'redirect_uri_mismatch', 'Bad Request');
    if (!form.get('code_verifier')) return googleError(res, 400, 'invalid_grant', 'Missing code verifier.');
    if (!pkceOk(form.get('code_verifier'), c.challenge)) return googleError(res, 400, 'invalid_grant', 'Invalid code verifier.');
    c.used = true;
    const body = googleTokens(c, c.offline);
    grant('google', grantType, c.account, client.id, body);
    return json(res, 200, body);
  }
  // refresh_token: Google does not rotate it; the answer has none.
  const presented = form.get('refresh_token');
  const r = google.refresh.get(presented);
  if (!presented) return googleError(res, 400, 'invalid_request', 'Missing required parameter: refresh_token');
  if (!r || !r.live) return googleError(res, 400, 'invalid_grant', 'Token has been expired or revoked.');
  const body = googleTokens(r, false);
  grant('google', grantType, r.account, client.id, body, { presented });
  return json(res, 200, body);
}

// -- ChatGPT (auth.openai.com, the Codex CLI's sign-in) ------------------------------------------
// The Codex CLI's device login (codex-rs/login/src/device_code_auth.rs) and its refresh
// (codex-rs/core/src/auth.rs): ISSUER/api/accounts/deviceauth/{usercode,token}, ISSUER/codex/device,
// ISSUER/oauth/token with the redirect ISSUER/deviceauth/callback.

const chatgpt = {
  devices: new Map(), // device_auth_id -> {user_code, exp, account, polls, answered}
  codes: new Map(), // authorization code -> {account, challenge, used}
  refresh: new Map(), // refresh token -> {account, state: 'live' | 'used' | 'revoked'}
};

/** OpenAI's API error shape. */
function openaiError(res, status, code, message, type = 'invalid_request_error') {
  fail(`chatgpt ${code}`);
  return json(res, status, { error: { message, type, param: null, code } });
}

function chatgptTokens(account) {
  const p = person(account);
  const iat = now();
  const ttl = config.chatgpt_ttl;
  const auth = { chatgpt_account_id: p.chatgptAccountId, chatgpt_plan_type: 'plus', chatgpt_user_id: `user-${p.oid.replace(/-/g, '').slice(0, 24)}` };
  const refreshToken = `rt_${random(48)}`;
  chatgpt.refresh.set(refreshToken, { account, state: 'live' });
  return {
    id_token: jwt({ iss: base, aud: [CODEX_CLIENT], sub: `auth0|${p.oid}`, email: account, email_verified: true, iat, exp: iat + 3600, auth_time: iat, 'https://api.openai.com/auth': auth }),
    access_token: jwt({
      iss: base, aud: ['https://api.openai.com/v1'], client_id: CODEX_CLIENT, sub: `auth0|${p.oid}`, email: account, iat, exp: iat + ttl, jti: randomUUID(),
      scp: ['openid', 'profile', 'email', 'offline_access'], 'https://api.openai.com/auth': auth, 'https://api.openai.com/profile': { email: account, email_verified: true },
    }),
    refresh_token: refreshToken,
    expires_in: ttl,
  };
}

/** The JSON body of an OpenAI endpoint, or undefined once the refusal was answered. */
async function openaiJson(req, res) {
  const text = await readBody(req);
  if (!isJson(req)) return void openaiError(res, 400, 'invalid_request', 'The body must be JSON (application/json).');
  try {
    return JSON.parse(text);
  } catch {
    return void openaiError(res, 400, 'invalid_request', 'The body is not valid JSON.');
  }
}

async function chatgptUserCode(req, res) {
  const body = await openaiJson(req, res);
  if (body === undefined) return undefined;
  if (body?.client_id !== CODEX_CLIENT) return openaiError(res, 400, 'invalid_client', `Unknown client_id: ${body?.client_id}`);
  const letters = 'ABCDEFGHJKLMNPQRSTUVWXYZ';
  const pick = (set, n) => Array.from(randomBytes(n), (b) => set[b % set.length]).join('');
  const userCode = `${pick(letters, 4)}-${pick('0123456789', 4)}`;
  const id = `deviceauth_${random(24)}`;
  chatgpt.devices.set(id, { user_code: userCode, exp: Date.now() + 15 * 60_000, account: null, polls: 0, answered: false });
  return json(res, 200, { device_auth_id: id, user_code: userCode, interval: '2' }); // the interval as a string, as the real one sends it
}

async function chatgptPoll(req, res) {
  const body = await openaiJson(req, res);
  if (body === undefined) return undefined;
  const d = chatgpt.devices.get(body?.device_auth_id);
  if (!d || d.user_code !== body?.user_code || d.exp <= Date.now() || d.answered) {
    fail('chatgpt deviceauth unknown');
    return json(res, 404, { error: { message: 'Device authorization not found or expired.', code: 'deviceauth_not_found' } });
  }
  if (!d.account) {
    // The real server answers "pending" with 403 and with 404; the fake takes turns.
    const status = d.polls % 2 === 0 ? 403 : 404;
    d.polls += 1;
    fail(`chatgpt pending ${status}`);
    return json(res, status, { error: { message: 'Device authorization is pending.', code: 'deviceauth_authorization_pending' } });
  }
  // Approved: the server made the PKCE pair; the client redeems the code with the verifier.
  d.answered = true;
  const verifier = random(64);
  const code = `ac_${random(40)}`;
  chatgpt.codes.set(code, { account: d.account, challenge: s256(verifier), used: false, exp: Date.now() + 10 * 60_000 });
  return json(res, 200, { authorization_code: code, code_challenge: s256(verifier), code_verifier: verifier });
}

function chatgptDevicePage(res, { error = '', done = '' } = {}) {
  if (done) return html(res, 200, 'Signed in to Codex', `<h1 id="chatgpt-done">Signed in as ${escape(done)}</h1><p>You can return to your device.</p>`);
  return html(res, error ? 400 : 200, 'Sign in to Codex with ChatGPT', `<h1>Enter the code shown on your device</h1>
${error ? `<p id="chatgpt-error" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/codex/device">
<label for="chatgpt-code">Code</label><input id="chatgpt-code" name="user_code" autocomplete="off" required>
<label for="chatgpt-user">Email address</label><input id="chatgpt-user" name="email" type="email" required>
<button id="chatgpt-continue" type="submit">Continue</button></form>`);
}

function chatgptApprove(res, form) {
  const userCode = (form.get('user_code') ?? '').trim().toUpperCase();
  const email = (form.get('email') ?? '').trim().toLowerCase();
  const d = [...chatgpt.devices.values()].find((x) => x.user_code === userCode && x.exp > Date.now() && !x.answered);
  if (!d) {
    fail('chatgpt device wrong_code');
    return chatgptDevicePage(res, { error: 'Invalid or expired code.' });
  }
  if (!/^[^@\s]+@[^@\s]+\.[^@\s]+$/.test(email)) return chatgptDevicePage(res, { error: 'Enter a valid email address.' });
  d.account = email;
  return chatgptDevicePage(res, { done: email });
}

async function chatgptToken(req, res) {
  const text = await readBody(req);
  if (isForm(req)) {
    const form = formOf(text);
    if (!form) return openaiError(res, 400, 'invalid_request', 'A parameter appears twice.');
    if (form.get('grant_type') === 'refresh_token') {
      return openaiError(res, 400, 'invalid_request', 'A refresh must be sent as JSON (application/json).');
    }
    if (form.get('grant_type') !== 'authorization_code') {
      fail('chatgpt unsupported_grant_type');
      return json(res, 400, { error: 'unsupported_grant_type', error_description: `Unsupported grant type: ${form.get('grant_type')}` });
    }
    const invalid = (error, description) => {
      fail(`chatgpt ${error}`);
      return json(res, 400, { error, error_description: description });
    };
    if (form.get('client_id') !== CODEX_CLIENT) return invalid('invalid_client', 'Unknown client.');
    if (form.get('redirect_uri') !== `${base}/deviceauth/callback`) return invalid('invalid_grant', `redirect_uri must be ${base}/deviceauth/callback`);
    const c = chatgpt.codes.get(form.get('code'));
    if (!c || c.used || c.exp <= Date.now()) return invalid('invalid_grant', 'Invalid authorization code.');
    if (!pkceOk(form.get('code_verifier'), c.challenge)) return invalid('invalid_grant', 'Invalid code_verifier.');
    c.used = true;
    const body = chatgptTokens(c.account);
    grant('chatgpt', 'authorization_code', c.account, CODEX_CLIENT, body);
    return json(res, 200, body);
  }
  if (!isJson(req)) return openaiError(res, 400, 'invalid_request', 'Unsupported content type.');
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    return openaiError(res, 400, 'invalid_request', 'The body is not valid JSON.');
  }
  if (body?.grant_type !== 'refresh_token') return openaiError(res, 400, 'unsupported_grant_type', `Unsupported grant type: ${body?.grant_type}`);
  if (body.client_id !== CODEX_CLIENT) return openaiError(res, 401, 'invalid_client', 'Unknown client.');
  if (!scopes(body.scope).includes('openid')) return openaiError(res, 400, 'invalid_scope', 'The refresh must ask for openid.');
  const r = chatgpt.refresh.get(body.refresh_token);
  if (!r) return openaiError(res, 401, 'refresh_token_expired', 'Your refresh token has expired. Please try signing in again.');
  if (r.state === 'used') return openaiError(res, 401, 'refresh_token_reused', 'Your refresh token has already been used to generate a new access token. Please try signing in again.');
  if (r.state === 'revoked') return openaiError(res, 401, 'refresh_token_invalidated', 'Your refresh token has been invalidated. Please try signing in again.');
  r.state = 'used';
  const answer = chatgptTokens(r.account);
  grant('chatgpt', 'refresh_token', r.account, CODEX_CLIENT, answer, { presented: body.refresh_token });
  return json(res, 200, answer);
}

// -- the server ----------------------------------------------------------------------------------

/** The endpoints whose requests /__requests lists: token, device and user-code ones. */
const PROTOCOL = /^(\/[^/]+\/oauth2\/v2\.0\/(token|devicecode)|\/token|\/oauth\/token|\/api\/accounts\/deviceauth\/(usercode|token))$/;

/** Notes how a protocol request came: its content type, client authentication and parameter names. */
async function note(req, path) {
  const text = await readBody(req);
  let params = [];
  if (isForm(req)) params = [...new URLSearchParams(text).keys()];
  else if (isJson(req)) {
    try {
      params = Object.keys(JSON.parse(text) ?? {});
    } catch {
      params = [];
    }
  }
  const basic = /^Basic\s/i.test(req.headers.authorization ?? '');
  requests.push({
    path, content_type: req.headers['content-type'] ?? null, params,
    client_auth: basic ? 'basic' : params.includes('client_secret') ? 'body' : 'none', at: Date.now(),
  });
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://127.0.0.1');
  const path = url.pathname;
  const { method } = req;

  // Test control API.
  if (method === 'GET' && path === '/__issued') return json(res, 200, issued);
  if (method === 'GET' && path === '/__failures') return json(res, 200, failures);
  if (method === 'GET' && path === '/__requests') return json(res, 200, requests);
  if (method === 'POST' && PROTOCOL.test(path)) await note(req, path);
  if (method === 'POST' && path === '/__revoke') {
    const idp = url.searchParams.get('idp');
    const account = (url.searchParams.get('account') ?? '').toLowerCase();
    const table = { entra: entra.refresh, google: google.refresh, chatgpt: chatgpt.refresh }[idp];
    if (!table || !account) return json(res, 400, { error: 'idp (entra|google|chatgpt) and account are required' });
    let revoked = 0;
    for (const r of table.values()) {
      if (r.account !== account || !(idp === 'chatgpt' ? r.state === 'live' : r.live)) continue;
      revoked += 1;
      if (idp === 'chatgpt') r.state = 'revoked';
      else r.live = false;
    }
    return json(res, 200, { revoked });
  }
  if (method === 'POST' && path === '/__config') {
    const change = JSON.parse((await readBody(req)) || '{}');
    for (const [k, v] of Object.entries(change)) {
      const ok = typeof config[k] === 'boolean' ? typeof v === 'boolean' : k in config && Number.isInteger(v) && v > 0;
      if (!ok) return json(res, 400, { error: `unknown setting or bad value: ${k}` });
      config[k] = v;
    }
    return json(res, 200, config);
  }

  // Microsoft Entra ID.
  let m = /^\/([^/]+)\/oauth2\/v2\.0\/(authorize|token|devicecode)$/.exec(path);
  if (m) {
    const [, tenant, endpoint] = m;
    if (endpoint === 'authorize' && method === 'GET') return entraAuthorize(res, decodeURIComponent(tenant), url.searchParams);
    if (method !== 'POST') return entraError(res, 400, 'invalid_request', 900144, { name: 'a POST body' });
    if (endpoint === 'token') return entraToken(req, res, decodeURIComponent(tenant));
    if (endpoint === 'devicecode') {
      const text = await readBody(req);
      const form = isForm(req) ? formOf(text) : new Map();
      return entraDeviceCode(req, res, decodeURIComponent(tenant), form ?? new Map());
    }
  }
  m = /^\/([^/]+)\/(login|devicelogin)$/.exec(path);
  if (m && !['o', 'api', 'codex', 'oauth'].includes(m[1])) {
    const tenant = decodeURIComponent(m[1]);
    if (m[2] === 'devicelogin' && method === 'GET') return entraDevicePage(res, tenant);
    if (method === 'POST') {
      const form = formOf(await readBody(req)) ?? new Map();
      return m[2] === 'login' ? entraLogin(res, tenant, form) : entraDeviceApprove(res, tenant, form);
    }
  }

  // Google.
  if (method === 'GET' && path === '/o/oauth2/v2/auth') return googleAuthorize(res, url.searchParams);
  if (method === 'POST' && path === '/o/oauth2/v2/auth/choose') return googleChoose(res, formOf(await readBody(req)) ?? new Map());
  if (method === 'POST' && path === '/token') return googleToken(req, res);

  // ChatGPT.
  if (method === 'POST' && path === '/api/accounts/deviceauth/usercode') return chatgptUserCode(req, res);
  if (method === 'POST' && path === '/api/accounts/deviceauth/token') return chatgptPoll(req, res);
  if (path === '/codex/device') {
    if (method === 'GET') return chatgptDevicePage(res);
    if (method === 'POST') return chatgptApprove(res, formOf(await readBody(req)) ?? new Map());
  }
  if (method === 'POST' && path === '/oauth/token') return chatgptToken(req, res);

  return json(res, 404, { error: 'not_found', error_description: `no route ${method} ${path}` });
}

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    process.stderr.write(`accounts: ${err.stack}\n`);
    if (!res.headersSent) json(res, 500, { error: 'server_error', error_description: String(err) });
  });
});
server.listen(Number(argv.port), '127.0.0.1', () => {
  base = `http://127.0.0.1:${server.address().port}`;
  process.stdout.write(`${JSON.stringify({ url: base })}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
