// Helpers for rota's browser and OAuth end-to-end tests: start the test IdP (idp.mjs), the
// scripted upstream (upstream.mjs) and `rota serve` in a temp dir, stop them all with deadlines,
// drive Debian Chromium with playwright-core, and log in through the IdP's real pages.
//
// Everything listens on 127.0.0.1. Every process started here is stopped by the test that
// started it (env.stop()), and killed with SIGKILL when the test process exits, as a last resort.

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

export const HERE = dirname(fileURLToPath(import.meta.url));
export const ARTIFACTS = join(HERE, 'artifacts');
export const ROTA_BIN = process.env.ROTA_BIN || resolve(HERE, '../../target/debug/rota');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const CLIENT_ID = 'rota';
export const CLIENT_SECRET = 'rota-secret';
export const PASTE_REDIRECT = 'http://localhost:1455/auth/callback';
export const MODEL = 'corp/gpt-4o-mini';
// The apps registered at the fake identity providers of accounts.mjs.
export const ENTRA_CLIENT_ID = 'rota-entra-app';
export const ENTRA_SECRET = 'entra-secret-0001';
export const GOOGLE_CLIENT_ID = 'rota-google.apps.googleusercontent.com';
export const GOOGLE_SECRET = 'google-secret-0001';

// Chromium as root on this machine; the resolver rule keeps it on loopback: no host name
// resolves, not even localhost (so the paste flow's http://localhost:1455 never loads).
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-dev-shm-usage',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-quic',
  '--no-first-run',
  '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1',
];

const STOP_GRACE_MS = 5_000;
const KILL_WAIT_MS = 2_000;

// -- processes -----------------------------------------------------------------------------------

const running = new Set();
process.on('exit', () => {
  for (const proc of running) {
    try {
      proc.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

/** A free TCP port on 127.0.0.1 (closed again before it is returned). */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** The environment for child processes: no proxies, no ROTA_/provider variables of the caller. */
export function cleanEnv(extra = {}) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(ROTA_|OPENAI_|ANTHROPIC_|LLMOCK_|NODE_TEST)/.test(k) || k === 'DATABASE_URL') continue;
    if (['http_proxy', 'https_proxy', 'all_proxy', 'no_proxy'].includes(k.toLowerCase())) continue;
    env[k] = v;
  }
  env.NO_PROXY = env.no_proxy = '127.0.0.1,localhost';
  return { ...env, ...extra };
}

function exited(proc) {
  return proc.exitCode !== null || proc.signalCode !== null;
}

function waitExit(proc, ms) {
  if (exited(proc)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    proc.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** SIGTERM, then SIGKILL after the grace period; resolves once the process is gone. */
export async function stopProcess(proc, graceMs = STOP_GRACE_MS) {
  if (!proc) return;
  if (!exited(proc)) {
    proc.kill('SIGTERM');
    if (!(await waitExit(proc, graceMs))) {
      proc.kill('SIGKILL');
      await waitExit(proc, KILL_WAIT_MS);
    }
  }
  running.delete(proc);
}

export function tail(path, lines = 40) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(none)';
  }
}

/**
 * Starts `cmd args` with stderr to `logPath`, and resolves with the first stdout line that is a
 * JSON object (the ready line), within deadlineMs. Later stdout lines go to the log as well.
 */
function spawnWithReadyLine(cmd, args, { cwd, env, logPath, deadlineMs = 20_000, name }) {
  const log = openSync(logPath, 'a');
  const proc = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', log] });
  closeSync(log);
  running.add(proc);
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    const fail = (why) => {
      clearTimeout(timer);
      stopProcess(proc).finally(() => reject(new Error(`${name}: ${why}\n--- ${logPath} ---\n${tail(logPath)}`)));
    };
    const timer = setTimeout(() => fail(`no ready line within ${deadlineMs} ms`), deadlineMs);
    let ready = false;
    lines.on('line', (line) => {
      if (ready) return;
      let parsed;
      try {
        parsed = JSON.parse(line);
      } catch {
        return;
      }
      if (parsed && typeof parsed === 'object') {
        ready = true;
        clearTimeout(timer);
        resolve({ proc, ready: parsed });
      }
    });
    proc.once('exit', (code, signal) => {
      if (!ready) fail(`exited (${code ?? signal}) before it was ready`);
    });
  });
}

/** Polls `fn` until it returns a truthy value; throws with `message` (and the last value) after deadlineMs. */
export async function waitUntil(fn, { deadlineMs = 10_000, intervalMs = 100, message = 'condition' } = {}) {
  const deadline = Date.now() + deadlineMs;
  let last;
  let lastErr;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${deadlineMs} ms waiting for ${message}; last value: ${JSON.stringify(last)}${lastErr ? `; last error: ${lastErr.message}` : ''}`);
    }
    await sleep(intervalMs);
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Sleeps until the wall-clock time `ms` (Date.now() scale); at once if it has passed. */
export const sleepUntil = (ms) => sleep(Math.max(0, ms - Date.now()));

async function fetchJson(url, init = {}) {
  const res = await fetch(url, { ...init, signal: AbortSignal.timeout(init.timeoutMs ?? 10_000) });
  const text = await res.text();
  let json;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, json, text };
}

// -- the IdP -------------------------------------------------------------------------------------

/**
 * Starts idp.mjs. Options: redirectUris, accessTtl (s), reuseDetection, alwaysLogin, host.
 * Returns {issuer, authorize_url, token_url, device_url, userinfo_url, stats(), issued(),
 * revoke(account), configure(change), stop()}.
 */
export async function startIdp({ dir, ...options }) {
  const configPath = join(dir, 'idp.json');
  writeFileSync(configPath, JSON.stringify({ clientId: CLIENT_ID, clientSecret: CLIENT_SECRET, ...options }, null, 2));
  const logPath = join(dir, 'idp.log');
  const { proc, ready } = await spawnWithReadyLine(process.execPath, [join(HERE, 'idp.mjs'), '--port', '0', '--config', configPath], {
    cwd: HERE, env: cleanEnv(), logPath, name: 'idp',
  });
  // Control calls go to 127.0.0.1 even when the issuer names localhost.
  const base = `http://127.0.0.1:${new URL(ready.issuer).port}`;
  return {
    ...ready,
    proc,
    logPath,
    base,
    async stats() {
      return (await fetchJson(`${base}/__test/stats`)).json;
    },
    async issued() {
      return (await fetchJson(`${base}/__test/issued`)).json;
    },
    /** The newest token response for `account` (optionally of one grant type). */
    async latest(account, grantType) {
      const all = await this.issued();
      return all.filter((i) => i.account === account && (!grantType || i.grant_type === grantType)).at(-1);
    },
    async revoke(account) {
      const r = await fetchJson(`${base}/__test/revoke?account=${encodeURIComponent(account)}`, { method: 'POST' });
      if (r.status !== 200) throw new Error(`revoke ${account}: ${r.status} ${r.text}`);
      return r.json;
    },
    async configure(change) {
      const r = await fetchJson(`${base}/__test/config`, { method: 'POST', body: JSON.stringify(change) });
      if (r.status !== 200) throw new Error(`configure: ${r.status} ${r.text}`);
      return r.json;
    },
    stop: () => stopProcess(proc),
  };
}

// -- the upstream --------------------------------------------------------------------------------

/** Starts upstream.mjs. Returns {url, script(), clearScript(), seen(), clearSeen(), stop()}. */
export async function startUpstream({ dir }) {
  const logPath = join(dir, 'upstream.log');
  const { proc, ready } = await spawnWithReadyLine(process.execPath, [join(HERE, 'upstream.mjs')], {
    cwd: HERE, env: cleanEnv(), logPath, name: 'upstream',
  });
  const { url } = ready;
  return {
    url,
    proc,
    logPath,
    async script(s) {
      const r = await fetchJson(`${url}/__script`, { method: 'POST', body: JSON.stringify(s) });
      if (r.status !== 200) throw new Error(`script: ${r.status} ${r.text}`);
    },
    async clearScript() {
      await fetchJson(`${url}/__script`, { method: 'DELETE' });
    },
    async seen() {
      return (await fetchJson(`${url}/__seen`)).json;
    },
    async clearSeen() {
      await fetchJson(`${url}/__seen`, { method: 'DELETE' });
    },
    stop: () => stopProcess(proc),
  };
}

// -- the fake Entra ID, Google and ChatGPT sign-ins -----------------------------------------------

/**
 * Starts accounts.mjs with `redirectUris` registered for its Entra app and Google client.
 * Returns {url, issued(), latest(idp, account, grantType?), failures(), failed(prefix), requests(),
 * revoke(idp, account), configure(change), stop()}.
 */
export async function startAccounts({ dir, redirectUris = [] }) {
  const logPath = join(dir, 'accounts.log');
  const args = [join(HERE, 'accounts.mjs'), ...redirectUris.flatMap((r) => ['--redirect', r])];
  const { proc, ready } = await spawnWithReadyLine(process.execPath, args, {
    cwd: HERE, env: cleanEnv(), logPath, name: 'accounts',
  });
  const { url } = ready;
  return {
    url,
    proc,
    logPath,
    async issued() {
      return (await fetchJson(`${url}/__issued`)).json;
    },
    /** The newest token response of `idp` for `account` (optionally of one grant type). */
    async latest(idp, account, grantType) {
      const all = await this.issued();
      return all.filter((i) => i.idp === idp && i.account === account && (!grantType || i.grant_type === grantType)).at(-1);
    },
    async failures() {
      return (await fetchJson(`${url}/__failures`)).json;
    },
    /** How many refusals have a key starting with `prefix` ("entra authorization_pending"). */
    async failed(prefix) {
      const all = await this.failures();
      return Object.entries(all).filter(([k]) => k.startsWith(prefix)).reduce((n, [, v]) => n + v, 0);
    },
    /** How each token, device or user-code request came: [{path, content_type, client_auth, params}]. */
    async requests() {
      return (await fetchJson(`${url}/__requests`)).json;
    },
    async revoke(idp, account) {
      const r = await fetchJson(`${url}/__revoke?idp=${encodeURIComponent(idp)}&account=${encodeURIComponent(account)}`, { method: 'POST' });
      if (r.status !== 200) throw new Error(`revoke ${idp} ${account}: ${r.status} ${r.text}`);
      return r.json;
    },
    async configure(change) {
      const r = await fetchJson(`${url}/__config`, { method: 'POST', body: JSON.stringify(change) });
      if (r.status !== 200) throw new Error(`configure: ${r.status} ${r.text}`);
      return r.json;
    },
    stop: () => stopProcess(proc),
  };
}

// -- rota ----------------------------------------------------------------------------------------

const q = (s) => JSON.stringify(String(s)); // a TOML basic string (JSON escapes are valid TOML)

/** rota.toml for the corp (redirect to rota) and corppaste (paste flow) providers. */
export function rotaToml({ dir, idp, upstream, lead = '5m', extra = '' }) {
  const oauth = [
    `authorize_url = ${q(idp.authorize_url)}`,
    `token_url = ${q(idp.token_url)}`,
    `device_url = ${q(idp.device_url)}`,
    `userinfo_url = ${q(idp.userinfo_url)}`,
    `client_id = ${q(CLIENT_ID)}`,
    'client_secret_env = "CORP_CLIENT_SECRET"',
    'scopes = ["openid", "email", "offline_access"]',
    'extra_params = { prompt = "consent" }',
  ].join('\n');
  return `# written by tests/browser/harness.mjs
[database]
url = ${q(`sqlite://${join(dir, 'rota.db')}`)}

[providers.corp]
api = "openai"
base_url = ${q(`${upstream.url}/v1`)}
quota = ["openai", "codex"]

[providers.corp.client_credentials]
token_url = ${q(idp.token_url)}
scopes = ["llm.invoke"]
allow_token_uri = ${q(`${upstream.url}/token`)}

[providers.corp.oauth]
${oauth}

[providers.corppaste]
api = "openai"
base_url = ${q(`${upstream.url}/v1`)}

[providers.corppaste.oauth]
${oauth}
redirect_uri = ${q(PASTE_REDIRECT)}

[models]
primary = ${q(MODEL)}

[refresh]
lead = ${q(lead)}

[timeouts]
connect = "2s"
first_byte = "10s"
idle = "10s"
total = "30s"
${extra}`;
}

function rotaEnv() {
  return cleanEnv({ CORP_CLIENT_SECRET: CLIENT_SECRET, ENTRA_SECRET, GOOGLE_SECRET, ROTA_LOG: 'warn' });
}

/** Runs `rota --config CONFIG args…` in dir; throws unless it exits 0. Returns its stdout. */
export function rotaCli(dir, args, { config = 'rota.toml' } = {}) {
  const out = spawnSync(ROTA_BIN, ['--config', join(dir, config), ...args], {
    cwd: dir, env: rotaEnv(), encoding: 'utf8', timeout: 30_000, stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (out.status !== 0) {
    throw new Error(`rota ${args.join(' ')} failed (${out.status ?? out.signal ?? out.error}):\n${out.stdout}\n${out.stderr}`);
  }
  return out.stdout;
}

/**
 * Starts `rota serve` on 127.0.0.1:port with the config file `config` in dir and waits for
 * GET /healthz 200. Returns a Rota handle.
 */
export async function startRota({ dir, port, adminKey, config = 'rota.toml', name = 'rota', deadlineMs = 20_000 }) {
  if (!existsSync(ROTA_BIN)) throw new Error(`rota binary not found at ${ROTA_BIN}: build it (cargo build) or set ROTA_BIN`);
  const logPath = join(dir, `${name}.log`);
  const log = openSync(logPath, 'a');
  const proc = spawn(ROTA_BIN, ['--config', join(dir, config), 'serve', '--listen', `127.0.0.1:${port}`], {
    cwd: dir, env: rotaEnv(), stdio: ['ignore', log, log],
  });
  closeSync(log);
  running.add(proc);
  const rota = new Rota({ url: `http://127.0.0.1:${port}`, port, proc, adminKey, logPath, name });
  try {
    await waitUntil(async () => {
      if (exited(proc)) throw new Error(`rota serve exited (${proc.exitCode ?? proc.signalCode})`);
      const r = await fetch(`${rota.url}/healthz`, { signal: AbortSignal.timeout(1_000) }).catch(() => null);
      return r?.status === 200;
    }, { deadlineMs, intervalMs: 100, message: `${rota.url}/healthz` });
  } catch (err) {
    await stopProcess(proc);
    throw new Error(`${err.message}\n--- ${logPath} ---\n${tail(logPath)}`);
  }
  return rota;
}

export class Rota {
  constructor({ url, port, proc, adminKey, logPath, name }) {
    Object.assign(this, { url, port, proc, adminKey, logPath, name });
  }

  /**
   * One HTTP call to rota. `key` (default the admin key; null for none) goes in
   * Authorization: Bearer; `cookie` and `csrf` send a console session instead.
   */
  async api(method, path, { body, key = this.adminKey, cookie, csrf, headers = {}, timeoutMs } = {}) {
    const h = { ...headers };
    if (key) h.authorization = `Bearer ${key}`;
    if (cookie) h.cookie = cookie;
    if (csrf) h['x-csrf-token'] = csrf;
    if (body !== undefined) h['content-type'] = 'application/json';
    return fetchJson(`${this.url}${path}`, {
      method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), redirect: 'manual', timeoutMs,
    });
  }

  /** A gateway call: POST /v1/chat/completions with the admin key. */
  async chat({ key = this.adminKey, model = MODEL, content = 'hi', timeoutMs = 30_000 } = {}) {
    return this.api('POST', '/v1/chat/completions', {
      key, timeoutMs, body: { model, messages: [{ role: 'user', content }] },
    });
  }

  async profiles() {
    const r = await this.api('GET', '/api/v1/profiles');
    if (r.status !== 200) throw new Error(`GET /api/v1/profiles: ${r.status} ${r.text}`);
    return r.json;
  }

  async profile(id) {
    return (await this.profiles()).find((p) => p.id === id);
  }

  /** Waits until the profile exists (and `ready(profile)` holds, if given). */
  async waitProfile(id, ready = () => true, deadlineMs = 15_000) {
    return waitUntil(async () => {
      const p = await this.profile(id);
      return p && ready(p) ? p : undefined;
    }, { deadlineMs, intervalMs: 200, message: `profile ${id}` });
  }

  stop() {
    return stopProcess(this.proc);
  }
}

// -- the whole environment -----------------------------------------------------------------------

/**
 * A temp dir with the IdP, the upstream and `rota serve` (with an admin agent `ops`).
 * Options: accessTtl (s, the IdP's), lead (rota's [refresh] lead), reuseDetection, idpHost,
 * browser (false: no Chromium), accounts (true: start accounts.mjs too, as env.accounts, with
 * rota's callback registered), extraToml (appended to rota.toml; a function of the env to use its
 * upstream's, IdP's or accounts' address).
 */
export async function startEnv({ accessTtl = 3600, lead = '5m', reuseDetection = true, idpHost = '127.0.0.1', browser = true, accounts = false, extraToml = '' } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'rota-browser-'));
  const env = { dir, stopped: false, browsers: [], children: [] };
  env.stop = async () => {
    if (env.stopped) return;
    env.stopped = true;
    await Promise.allSettled(env.browsers.map((b) => closeBrowser(b)));
    await Promise.allSettled(env.children.map((c) => c.stop()));
    if (!process.env.KEEP_TMP) rmSync(dir, { recursive: true, force: true });
  };
  env.logs = () => env.children.map((c) => `--- ${c.logPath} ---\n${tail(c.logPath)}`).join('\n');
  try {
    // rota's port first: the IdP's redirect URIs name it.
    const rotaPort = await freePort();
    env.idp = await startIdp({
      dir,
      host: idpHost,
      accessTtl,
      reuseDetection,
      redirectUris: [`http://127.0.0.1:${rotaPort}/oauth/callback`, PASTE_REDIRECT],
    });
    env.children.push(env.idp);
    env.upstream = await startUpstream({ dir });
    env.children.push(env.upstream);
    if (accounts) {
      env.accounts = await startAccounts({ dir, redirectUris: [`http://127.0.0.1:${rotaPort}/oauth/callback`] });
      env.children.push(env.accounts);
    }
    const extra = typeof extraToml === 'function' ? extraToml(env) : extraToml;
    writeFileSync(join(dir, 'rota.toml'), rotaToml({ dir, idp: env.idp, upstream: env.upstream, lead, extra }));
    const created = rotaCli(dir, ['agents', 'create', 'ops', '--admin']).trim().split('\n');
    env.adminKey = created.at(-1).trim();
    if (!env.adminKey.startsWith('rk_')) throw new Error(`agents create printed no key: ${created.join('\n')}`);
    env.rota = await startRota({ dir, port: rotaPort, adminKey: env.adminKey });
    env.children.push(env.rota);
    if (browser) {
      env.browser = await launchBrowser({ resolveLocalhost: idpHost === 'localhost' });
      env.browsers.push(env.browser);
    }
    return env;
  } catch (err) {
    await env.stop();
    throw err;
  }
}

/**
 * A node:test test with its own environment, bounded in time. On failure the tails of the
 * children's logs are printed. body(t, env). `todo: "why"` marks a known gap: the test runs and
 * reports, but its failure does not fail the run.
 */
export function e2e(name, { timeoutMs = 120_000, todo, ...options }, body) {
  return test(name, { timeout: timeoutMs, todo }, async (t) => {
    const env = await startEnv(options);
    t.after(() => env.stop());
    try {
      await body(t, env);
    } catch (err) {
      process.stderr.write(`\n[${name}] failed; logs of ${env.dir}:\n${env.logs()}\n`);
      throw err;
    }
  });
}

// -- the browser ---------------------------------------------------------------------------------

/**
 * Debian Chromium through playwright-core (playwright gives each launch a fresh temp profile).
 * resolveLocalhost: let `localhost` resolve too (for an IdP on another site than rota).
 */
export async function launchBrowser({ resolveLocalhost = false } = {}) {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} not found: apt-get install -y chromium`);
  const args = resolveLocalhost
    ? CHROMIUM_ARGS.map((a) => (a.startsWith('--host-resolver-rules=') ? `${a} , EXCLUDE localhost` : a))
    : CHROMIUM_ARGS;
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args, timeout: 30_000 });
}

async function closeBrowser(browser) {
  await Promise.race([browser.close(), sleep(5_000)]);
}

/**
 * A new page in its own context (own cookies); dialogs (confirm()) are accepted. bypassCSP: for
 * the accessibility scan, whose script the console's Content-Security-Policy would refuse.
 */
export async function newPage(browser, { acceptDialogs = true, width = 1280, height = 900, bypassCSP = false, locale, timezoneId } = {}) {
  const context = await browser.newContext({ viewport: { width, height }, bypassCSP, locale, timezoneId });
  context.setDefaultTimeout(15_000);
  context.setDefaultNavigationTimeout(20_000);
  const page = await context.newPage();
  if (acceptDialogs) page.on('dialog', (d) => d.accept().catch(() => {}));
  return page;
}

/**
 * A screenshot of the whole page, or of the element `target` (a locator) only. The console
 * re-renders its views in the background: an element replaced mid-shot is looked up again.
 */
async function screenshot(page, path, target) {
  if (!target) return page.screenshot({ path, fullPage: true });
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await target.screenshot({ path, timeout: 5_000 });
    } catch (err) {
      if (attempt === 3 || !/not attached|detached|not visible/i.test(err.message)) throw err;
    }
  }
}

export async function shot(page, name, { target } = {}) {
  mkdirSync(ARTIFACTS, { recursive: true });
  await screenshot(page, join(ARTIFACTS, `${name}.png`), target);
}

/**
 * A screenshot for the docs: into artifacts/ always, and into docs/img/ as well when
 * ROTA_DOC_SHOTS=1 (scripts/screenshots.sh). target: one element (a locator) instead of the page.
 */
export async function docShot(page, name, { target } = {}) {
  await shot(page, name, { target });
  if (process.env.ROTA_DOC_SHOTS === '1') {
    const img = resolve(HERE, '../../docs/img');
    mkdirSync(img, { recursive: true });
    await screenshot(page, join(img, `${name}.png`), target);
  }
}

const AXE = join(HERE, 'node_modules/axe-core/axe.min.js');

/**
 * axe-core's WCAG 2.x A/AA scan of the page as it is now; returns the serious and critical
 * violations, each as "rule: target, target…". The page's context needs bypassCSP.
 */
export async function axeScan(page) {
  if (!(await page.evaluate(() => typeof window.axe !== 'undefined'))) await page.addScriptTag({ path: AXE });
  const result = await page.evaluate(() => window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } }));
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 5).map((n) => n.target.join(' ')).join(', ')}`);
}

/** Signs in to rota's console with the key and opens the profiles tab. */
export async function signIn(page, rota, key = rota.adminKey) {
  await page.goto(`${rota.url}/ui/`);
  await page.locator('#admin-key').fill(key);
  await page.locator('#sign-in').click();
  await page.locator('body[data-ready="true"]').waitFor({ state: 'attached' });
  await page.locator('#tab-profiles').click();
  await page.locator('#view-profiles').waitFor({ state: 'visible' });
}

/** Clicks `locator` and waits for the main frame's next committed navigation. */
async function clickAndWaitNav(page, locator, timeout = 15_000) {
  const nav = page.waitForEvent('framenavigated', { predicate: (f) => f === page.mainFrame(), timeout });
  await locator.click();
  await nav;
  await page.waitForLoadState('domcontentloaded');
}

/**
 * Drives the IdP's own pages in `page` until the browser leaves the IdP: the device user-code
 * form (fills `userCode` if it is empty), the device confirmation, the login form (any
 * password) and the consent page. Returns the steps taken, e.g. ['login', 'consent'].
 */
export async function idpLogin(page, idp, login, { userCode, deadlineMs = 30_000 } = {}) {
  const origin = new URL(idp.issuer).origin;
  const deadline = Date.now() + deadlineMs;
  const steps = [];
  let unknownSince;
  const has = async (selector) => (await page.locator(selector).count()) > 0;
  while (Date.now() < deadline) {
    await page.waitForLoadState('domcontentloaded');
    if (!page.url().startsWith(origin)) return steps;
    if (await has('#error')) {
      throw new Error(`the IdP shows an error at ${page.url()}: ${await page.locator('#error').innerText()}`);
    }
    if (await has('input[name="login"]')) {
      await page.locator('input[name="login"]').fill(login);
      await page.locator('input[name="password"]').fill('any password');
      steps.push('login');
      await clickAndWaitNav(page, page.locator('button[type="submit"]'));
    } else if (await has('input[name="prompt"][value="consent"]')) {
      steps.push('consent');
      await clickAndWaitNav(page, page.locator('button[type="submit"]'));
    } else if (await has('form[id="op.deviceInputForm"]')) {
      const input = page.locator('input[name="user_code"]');
      if (!(await input.inputValue())) {
        if (!userCode) throw new Error('the IdP asks for a user code and none was given');
        await input.fill(userCode);
      }
      steps.push('user_code');
      await clickAndWaitNav(page, page.locator('button[form="op.deviceInputForm"]'));
    } else if (await has('form[id="op.deviceConfirmForm"]')) {
      steps.push('device_confirm');
      await clickAndWaitNav(page, page.locator('button[autofocus]'));
    } else if ((await page.title()) === 'Sign-in Success') {
      steps.push('device_success');
      return steps;
    } else if ((await page.title()) === 'Submitting Callback') {
      // oidc-provider's auto-submitting form_post page: wait for its navigation.
      await page.waitForEvent('framenavigated', { predicate: (f) => f === page.mainFrame(), timeout: 10_000 }).catch(() => {});
    } else {
      // Between two documents (or one still loading): look again shortly; give up after 5 s.
      unknownSince ??= Date.now();
      if (Date.now() - unknownSince > 5_000) {
        const content = await page.content().catch((err) => `(no content: ${err.message})`);
        throw new Error(`unknown IdP page at ${page.url()} (steps ${steps}): ${content.slice(0, 500)}`);
      }
      await sleep(100);
      continue;
    }
    unknownSince = undefined;
  }
  throw new Error(`the IdP login for ${login} did not finish within ${deadlineMs} ms (at ${page.url()}; steps ${steps})`);
}

/**
 * Logs `login` in for `provider` through the API and the browser: POST
 * /api/v1/oauth/{provider}/authorize, then the IdP's pages in a fresh page, which ends at rota's
 * /oauth/callback. Resolves with the new profile (as GET /api/v1/profiles shows it).
 */
export async function apiLogin(env, login, provider = 'corp') {
  const r = await env.rota.api('POST', `/api/v1/oauth/${provider}/authorize`, { body: {} });
  if (r.status !== 200 && r.status !== 201) throw new Error(`authorize: ${r.status} ${r.text}`);
  const page = await newPage(env.browser);
  try {
    await page.goto(r.json.authorize_url);
    await idpLogin(page, env.idp, login);
    if (!page.url().startsWith(env.rota.url)) throw new Error(`the login ended at ${page.url()}, not at rota`);
  } finally {
    await page.context().close();
  }
  return env.rota.waitProfile(`${provider}:${login}@example.com`);
}

/**
 * Watches `page` for the navigation to the paste-flow redirect URI (nothing listens there, so
 * the page itself ends on Chromium's error page; route interception does not see redirected
 * navigations). Returns a promise of that URL.
 */
export function capturePasteRedirect(page, deadlineMs = 60_000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no navigation to ${PASTE_REDIRECT} within ${deadlineMs} ms`)), deadlineMs);
    const onRequest = (req) => {
      if (req.isNavigationRequest() && req.url().startsWith(`${PASTE_REDIRECT}?`)) {
        clearTimeout(timer);
        page.off('request', onRequest);
        resolve(req.url());
      }
    };
    page.on('request', onRequest);
  });
}

/** A random string for forged values. */
export const randomToken = (n = 16) => randomBytes(n).toString('base64url');
