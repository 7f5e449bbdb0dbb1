// `rota login` from the terminal against the real IdP: the device flow (the CLI prints a code,
// the user enters it in a browser) and the paste flow (the CLI prints the login address and
// reads the address the browser ended on from stdin). Logging in the same account again
// updates its profile instead of adding a twin.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';

import { ROTA_BIN, capturePasteRedirect, cleanEnv, CLIENT_SECRET, e2e, idpLogin, newPage, rotaCli, waitUntil } from './harness.mjs';

/** Starts `rota login …`; collects its output; `exited` resolves with the exit code. */
function startLogin(dir, args) {
  const child = spawn(ROTA_BIN, ['--config', join(dir, 'rota.toml'), 'login', ...args], {
    cwd: dir,
    env: cleanEnv({ CORP_CLIENT_SECRET: CLIENT_SECRET, ROTA_LOG: 'warn' }),
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const out = { stdout: '', stderr: '', child };
  child.stdout.on('data', (d) => (out.stdout += d));
  child.stderr.on('data', (d) => (out.stderr += d));
  out.exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  return out;
}

function profiles(dir) {
  return JSON.parse(rotaCli(dir, ['profiles', 'list', '--json']));
}

e2e('rota login --device and rota login (paste) against the real IdP', { timeoutMs: 120_000 }, async (t, env) => {
  const { dir, idp } = env;
  const page = await newPage(env.browser);

  // Device flow: the CLI prints the link and the code, then waits.
  const device = startLogin(dir, ['corp', '--device']);
  await waitUntil(() => /enter the code (\S+)/.test(device.stderr), { message: 'the CLI printed a code', deadlineMs: 15_000 });
  const userCode = device.stderr.match(/enter the code (\S+)/)[1];
  const link = new URL(device.stderr.match(/Open (\S+)/)[1]);
  assert.equal(`${link.origin}${link.pathname}`, `${idp.issuer}/device`);
  await page.goto(`${link.origin}${link.pathname}`);
  assert.deepEqual(await idpLogin(page, idp, 'dave', { userCode }), ['user_code', 'device_confirm', 'login', 'consent', 'device_success']);
  assert.equal(await device.exited, 0, device.stderr);
  assert.match(device.stdout, /^added corp:dave@example\.com$/m);
  const dave = profiles(dir).find((p) => p.id === 'corp:dave@example.com');
  assert.equal(dave?.type, 'oauth');
  assert.ok(!device.stdout.includes((await idp.latest('dave', 'urn:ietf:params:oauth:grant-type:device_code')).access_token), 'no token on stdout');

  // Paste flow (corppaste's redirect is a loopback address nothing serves).
  const paste = startLogin(dir, ['corppaste']);
  await waitUntil(() => /\nhttp\S+/.test(paste.stderr), { message: 'the CLI printed the login address', deadlineMs: 15_000 });
  const authorize = paste.stderr.match(/\n(http\S+)/)[1];
  const redirect = capturePasteRedirect(page);
  await page.goto(authorize);
  assert.deepEqual(await idpLogin(page, idp, 'erin'), ['login', 'consent']);
  paste.child.stdin.end(`${await redirect}\n`);
  assert.equal(await paste.exited, 0, paste.stderr);
  assert.match(paste.stdout, /^added corppaste:erin@example\.com$/m);

  // The same account again: updated, not twinned.
  const again = startLogin(dir, ['corp', '--device']);
  await waitUntil(() => /enter the code (\S+)/.test(again.stderr), { message: 'the CLI printed a code', deadlineMs: 15_000 });
  await page.goto(`${idp.issuer}/device`);
  await idpLogin(page, idp, 'dave', { userCode: again.stderr.match(/enter the code (\S+)/)[1] });
  assert.equal(await again.exited, 0, again.stderr);
  assert.match(again.stdout, /^updated corp:dave@example\.com$/m);
  assert.equal(profiles(dir).filter((p) => p.id.startsWith('corp:dave')).length, 1);

  // A forged paste is refused and adds nothing.
  const forged = startLogin(dir, ['corppaste']);
  await waitUntil(() => /\nhttp\S+/.test(forged.stderr), { message: 'the CLI printed the login address', deadlineMs: 15_000 });
  forged.child.stdin.end('http://localhost:1455/auth/callback?code=abc&state=forged\n');
  assert.notEqual(await forged.exited, 0);
  assert.match(forged.stderr, /state.*does not match/);
  assert.equal(profiles(dir).length, 2);
});
