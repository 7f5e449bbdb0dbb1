#!/usr/bin/env node
// A real OpenID provider for rota's end-to-end tests: oidc-provider 9 (certified) with its
// built-in development login and consent pages, on 127.0.0.1 only.
//
//   node idp.mjs --port P --config FILE.json      (or IDP_PORT, IDP_CONFIG)
//
// prints one JSON line on stdout once it answers:
//   {"issuer", "authorize_url", "token_url", "device_url", "userinfo_url", "discovery_url"}
//
// Config JSON (every key optional):
//   port           listen port (0 = any free one; --port beats it)
//   host           host name in the issuer, default "127.0.0.1" ("localhost" puts the IdP on
//                  another site than a rota on 127.0.0.1; it still listens on 127.0.0.1 only)
//   clientId       "rota";  clientSecret "rota-secret"
//                  (and a second, fixed client for the client credentials grant: `svc-app`,
//                  secret `svc-app-secret-0001`, scope `llm.invoke`, secret in the form body)
//   redirectUris   the client's redirect URIs (exact match)
//   accessTtl      access token lifetime in seconds, default 3600
//   refreshTtl     refresh token lifetime in seconds, default 14 days
//   alwaysLogin    true (default): every authorization shows the login page, even with a live
//                  IdP session, so one browser can log in several accounts one after the other
//   reuseDetection true (default, oidc-provider's own behaviour): presenting an already rotated
//                  refresh token revokes the whole grant. false: it only answers invalid_grant
//
// Accounts: any login name works (the password is not checked). An account's `sub` is the login
// name, its `email` is `<login>@example.com`, `email_verified` is true; except, by the login's
// prefix, `unverified-…` (`email_verified: false`), `stringfalse-…` (the string "false") and
// `username-…` (no email: `preferred_username` is `<login>@example.com`, with the profile scope).
//
// Test control API (not OpenID; loopback only like everything here):
//   GET  /__test/stats              {"refresh_grants", "code_grants", "device_grants", "failures"}
//                                   successful token-endpoint grants by type; failures counts
//                                   token-endpoint errors as {"<grant_type> <error>": n}
//                                   (device polling's authorization_pending included)
//   GET  /__test/issued             every token response: [{grant_type, account, access_token,
//                                   refresh_token, expires_in, at}], oldest first
//   POST /__test/revoke?account=A   revokes every grant, refresh token, access token and pending
//                                   code of account A -> {"revoked": n}
//   POST /__test/config {"accessTtl"?, "reuseDetection"?}   changes these at run time

import { randomBytes, generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { interactionPolicy } from 'oidc-provider';

const { values: argv } = parseArgs({
  options: { port: { type: 'string' }, config: { type: 'string' } },
});
// The environment works too: IDP_PORT, IDP_CONFIG.
argv.port ??= process.env.IDP_PORT;
argv.config ??= process.env.IDP_CONFIG;
const fileConfig = argv.config ? JSON.parse(readFileSync(argv.config, 'utf8')) : {};
const cfg = {
  port: 0,
  host: '127.0.0.1',
  clientId: 'rota',
  clientSecret: 'rota-secret',
  redirectUris: [],
  accessTtl: 3600,
  refreshTtl: 14 * 24 * 3600,
  alwaysLogin: true,
  reuseDetection: true,
  ...fileConfig,
};
if (argv.port !== undefined) cfg.port = Number(argv.port);
// Runtime-changeable settings (POST /__test/config).
const live = { accessTtl: cfg.accessTtl, reuseDetection: cfg.reuseDetection };

// -- storage -------------------------------------------------------------------------------------
// One Map for every model, so the control API can find an account's tokens and grants.
// Entries: key "<Model>:<id>" -> {payload, expiresAt (ms or Infinity)}.
const store = new Map();
const GRANTABLE = new Set(['AccessToken', 'AuthorizationCode', 'RefreshToken', 'DeviceCode', 'BackchannelAuthenticationRequest']);

function live_(key) {
  const entry = store.get(key);
  if (!entry) return undefined;
  if (entry.expiresAt <= Date.now()) {
    store.delete(key);
    return undefined;
  }
  return entry;
}

class TestAdapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    const expiresAt = typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : Infinity;
    store.set(this.key(id), { payload, expiresAt });
    if (payload.uid) store.set(`uid:${payload.uid}`, { payload: id, expiresAt });
    if (payload.userCode) store.set(`userCode:${payload.userCode}`, { payload: id, expiresAt });
  }

  async find(id) {
    return live_(this.key(id))?.payload;
  }

  async findByUid(uid) {
    const id = live_(`uid:${uid}`)?.payload;
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = live_(`userCode:${userCode}`)?.payload;
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const entry = live_(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    const prefix = `${this.model}:`;
    for (const [key, entry] of store) {
      if (key.startsWith(prefix) && GRANTABLE.has(this.model) && entry.payload.grantId === grantId) {
        store.delete(key);
      }
    }
  }
}

// Removes everything of one account: its grants and every token or code that belongs to it.
function revokeAccount(account) {
  let revoked = 0;
  for (const [key, entry] of store) {
    const model = key.slice(0, key.indexOf(':'));
    if ((GRANTABLE.has(model) || model === 'Grant' || model === 'Session') && entry.payload?.accountId === account) {
      store.delete(key);
      if (model === 'RefreshToken' || model === 'Grant') revoked += 1;
    }
  }
  return revoked;
}

// -- the provider --------------------------------------------------------------------------------
const issuerHost = cfg.host;
const server = http.createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(cfg.port, '127.0.0.1', resolve);
});
const { port } = server.address();
const issuer = `http://${issuerHost}:${port}`;

// Every authorization asks for a login (unless this interaction already did one), like a
// browser with no IdP session: several accounts can log in one after the other.
const policy = interactionPolicy.base();
if (cfg.alwaysLogin) {
  policy.get('login').checks.add(new interactionPolicy.Check(
    'always_login',
    'this test IdP asks for a login on every authorization',
    (ctx) => (ctx.oidc.result?.login ? interactionPolicy.Check.NO_NEED_TO_PROMPT : interactionPolicy.Check.REQUEST_PROMPT),
  ));
}

const signingKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' });

const provider = new Provider(issuer, {
  adapter: TestAdapter,
  clients: [{
    // A service identity: rota exchanges its id and secret for access tokens
    // (client_credentials profiles), the secret in the form body as Entra ID takes it.
    client_id: 'svc-app',
    client_secret: 'svc-app-secret-0001',
    client_name: 'a service principal (test)',
    token_endpoint_auth_method: 'client_secret_post',
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    scope: 'llm.invoke',
  }, {
    client_id: cfg.clientId,
    client_secret: cfg.clientSecret,
    client_name: 'rota (test)',
    // The secret is accepted both ways: oidc-provider 9 lets a client registered with one
    // secret method authenticate with the other (client_secret_basic or client_secret_post).
    token_endpoint_auth_method: 'client_secret_basic',
    // native: http redirect URIs on loopback hosts (127.0.0.1, localhost) are allowed.
    application_type: 'native',
    redirect_uris: cfg.redirectUris,
    response_types: ['code'],
    grant_types: ['authorization_code', 'refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'],
    scope: 'openid email profile offline_access',
  }],
  clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
  pkce: { required: () => true }, // S256 is the only method oidc-provider 9 accepts
  scopes: ['openid', 'email', 'profile', 'offline_access', 'llm.invoke'],
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['preferred_username'] },
  // The email claims go into the id_token as well as /me (rota may read either).
  conformIdTokenClaims: false,
  async findAccount(_ctx, id) {
    return {
      accountId: id,
      async claims() {
        const email = `${id}@example.com`;
        if (id.startsWith('unverified-')) return { sub: id, email, email_verified: false };
        if (id.startsWith('stringfalse-')) return { sub: id, email, email_verified: 'false' };
        if (id.startsWith('username-')) return { sub: id, preferred_username: email };
        return { sub: id, email, email_verified: true };
      },
    };
  },
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: true }, // built-in login and consent pages
    deviceFlow: { enabled: true }, // user-code page at the default /device
    revocation: { enabled: true },
    userinfo: { enabled: true }, // /me
  },
  interactions: { policy },
  rotateRefreshToken: true, // every refresh answers a new refresh token; the old one is spent
  ttl: {
    AccessToken: () => live.accessTtl,
    RefreshToken: cfg.refreshTtl,
    AuthorizationCode: 120,
    DeviceCode: 600,
    Grant: cfg.refreshTtl,
    Interaction: 600,
    Session: 3600,
    IdToken: 3600,
  },
  cookies: { keys: [randomBytes(32).toString('base64url')] },
  jwks: { keys: [{ ...signingKey, kid: 'test', use: 'sig', alg: 'RS256' }] },
  // No error page detail leaks; plain text is enough for tests that read it.
  renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = `<!DOCTYPE html><title>oops</title><pre id="error">${Object.entries(out)
      .map(([k, v]) => `${k}: ${String(v).replace(/[<>&]/g, '')}`).join('\n')}</pre>`;
  },
});
provider.proxy = false;

// -- counting grants and recording issued tokens --------------------------------------------------
const stats = { refresh_grants: 0, code_grants: 0, device_grants: 0, failures: {} };
const COUNTER = {
  refresh_token: 'refresh_grants',
  authorization_code: 'code_grants',
  'urn:ietf:params:oauth:grant-type:device_code': 'device_grants',
};
const issued = [];

provider.use(async (ctx, next) => {
  // reuseDetection=false: answer a spent (rotated) refresh token with invalid_grant before
  // oidc-provider sees it, so the grant survives.
  if (!live.reuseDetection && ctx.method === 'POST' && ctx.path === '/token') {
    const body = await readForm(ctx.req);
    ctx.req.body = body; // oidc-provider reads a pre-parsed body from here
    if (body.grant_type === 'refresh_token' && typeof body.refresh_token === 'string') {
      const entry = live_(`RefreshToken:${body.refresh_token}`);
      if (entry?.payload.consumed) {
        bump(stats.failures, 'refresh_token invalid_grant');
        ctx.status = 400;
        ctx.set('cache-control', 'no-store');
        ctx.body = { error: 'invalid_grant', error_description: 'refresh token already used' };
        return;
      }
    }
  }
  await next();
  if (ctx.oidc?.route !== 'token') return;
  const grantType = ctx.oidc.params?.grant_type;
  if (ctx.status === 200 && ctx.body && typeof ctx.body === 'object') {
    if (COUNTER[grantType]) stats[COUNTER[grantType]] += 1;
    issued.push({
      grant_type: grantType,
      account: ctx.oidc.entities?.Account?.accountId ?? ctx.oidc.entities?.AccessToken?.accountId,
      access_token: ctx.body.access_token,
      refresh_token: ctx.body.refresh_token,
      expires_in: ctx.body.expires_in,
      at: Date.now(),
    });
  } else {
    const error = ctx.body && typeof ctx.body === 'object' ? ctx.body.error : `http_${ctx.status}`;
    bump(stats.failures, `${grantType} ${error}`);
  }
});

function bump(obj, key) {
  obj[key] = (obj[key] ?? 0) + 1;
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Object.fromEntries(new URLSearchParams(Buffer.concat(chunks).toString('utf8')));
}

// -- HTTP ----------------------------------------------------------------------------------------
const oidcCallback = provider.callback();

function json(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' });
  res.end(body);
}

async function control(req, res, url) {
  if (req.method === 'GET' && url.pathname === '/__test/stats') return json(res, 200, stats);
  if (req.method === 'GET' && url.pathname === '/__test/issued') return json(res, 200, issued);
  if (req.method === 'POST' && url.pathname === '/__test/revoke') {
    const account = url.searchParams.get('account');
    if (!account) return json(res, 400, { error: 'account is required' });
    return json(res, 200, { revoked: revokeAccount(account) });
  }
  if (req.method === 'POST' && url.pathname === '/__test/config') {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const change = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    for (const key of Object.keys(change)) {
      if (!(key in live)) return json(res, 400, { error: `unknown key ${key}` });
    }
    Object.assign(live, change);
    return json(res, 200, live);
  }
  return json(res, 404, { error: 'no such test endpoint' });
}

server.on('request', (req, res) => {
  const url = new URL(req.url, issuer);
  if (url.pathname.startsWith('/__test/')) {
    control(req, res, url).catch((err) => json(res, 500, { error: String(err) }));
    return;
  }
  oidcCallback(req, res);
});

// Ready: the discovery document, read back over HTTP, names the endpoints.
const discovery = await new Promise((resolve, reject) => {
  // oidc-provider names endpoints after the request's Host: ask as a client of the issuer would.
  http.get(`http://127.0.0.1:${port}/.well-known/openid-configuration`, { headers: { host: `${issuerHost}:${port}` } }, (res) => {
    const chunks = [];
    res.on('data', (c) => chunks.push(c));
    res.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch (err) {
        reject(err);
      }
    });
  }).on('error', reject);
});
process.stdout.write(`${JSON.stringify({
  issuer: discovery.issuer,
  authorize_url: discovery.authorization_endpoint,
  token_url: discovery.token_endpoint,
  device_url: discovery.device_authorization_endpoint,
  userinfo_url: discovery.userinfo_endpoint,
  discovery_url: `${issuer}/.well-known/openid-configuration`,
})}\n`);

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
