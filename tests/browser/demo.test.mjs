// The first five minutes: `rota demo` as the README starts it. Its printed lines (the console's
// address and the admin key) lead to a signed-in console that shows the demo's providers, and
// the printed curl lines (run by sh with ROTA_DEMO_KEY set, as the demo says) show up in the requests view.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';

import { ROTA_BIN, cleanEnv, freePort, launchBrowser, newPage, stopProcess, waitUntil } from './harness.mjs';

/** Starts `rota demo` in dir; resolves with its stdout lines once it printed the admin key. */
function startDemo(dir, port) {
  const proc = spawn(ROTA_BIN, ['demo', '--listen', `127.0.0.1:${port}`], { cwd: dir, env: cleanEnv({ ROTA_LOG: 'warn' }), stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = [];
  let stderr = '';
  proc.stderr.on('data', (d) => (stderr += d));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`rota demo printed no admin key in 30 s:\n${lines.join('\n')}\n${stderr}`)), 30_000);
    createInterface({ input: proc.stdout }).on('line', (line) => {
      lines.push(line);
      if (line.startsWith('admin key: ')) {
        clearTimeout(timer);
        resolve({ proc, lines });
      }
    });
    proc.once('exit', (code) => reject(new Error(`rota demo exited (${code}):\n${lines.join('\n')}\n${stderr}`)));
  });
}

/** The printed curl commands, each with its continuation lines joined. */
function curlCommands(lines) {
  const commands = [];
  for (let i = 0; i < lines.length; i += 1) {
    if (!lines[i].trim().startsWith('curl ')) continue;
    let cmd = lines[i];
    while (cmd.trimEnd().endsWith('\\') && i + 1 < lines.length) {
      i += 1;
      cmd = `${cmd.trimEnd().slice(0, -1)} ${lines[i]}`;
    }
    commands.push(cmd.trim());
  }
  return commands;
}

test('rota demo: its printed lines lead to a signed-in console', { timeout: 120_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rota-demo-'));
  const port = await freePort();
  const { proc, lines } = await startDemo(dir, port);
  const browser = await launchBrowser();
  t.after(async () => {
    await browser.close();
    await stopProcess(proc);
    rmSync(dir, { recursive: true, force: true });
  });
  const consoleUrl = lines.find((l) => l.startsWith('console: ')).slice('console: '.length).trim();
  const key = lines.find((l) => l.startsWith('admin key: ')).slice('admin key: '.length).trim();
  assert.equal(consoleUrl, `http://127.0.0.1:${port}/ui/`);
  assert.match(lines.join('\n'), /signs? in/i, 'the demo says the key signs in to the console');

  const curls = curlCommands(lines);
  assert.ok(curls.length >= 2, `two curl lines (a model and the fallback one): ${curls.join('\n')}`);
  assert.ok(curls.some((c) => c.includes('"smart"')), 'one curl line asks for smart');
  for (const cmd of curls) {
    // As the demo says: the admin key in ROTA_DEMO_KEY.
    const out = spawnSync('sh', ['-c', cmd], { encoding: 'utf8', timeout: 20_000, env: cleanEnv({ ROTA_DEMO_KEY: key }) });
    assert.equal(out.status, 0, `${cmd}\n${out.stderr}`);
    assert.match(out.stdout, /HTTP\/1\.1 200/, `${cmd}\n${out.stdout}`);
  }

  const page = await newPage(browser, { width: 1440 });
  await page.goto(consoleUrl);
  await page.locator('#admin-key').fill(key);
  await page.locator('#sign-in').click();
  await page.locator('body[data-ready="true"]').waitFor({ state: 'attached' });
  for (const provider of ['alpha', 'beta', 'gamma', 'claude']) {
    await page.locator(`#strips [data-provider="${provider}"]`).waitFor();
  }
  await page.locator('#tab-requests').click();
  await waitUntil(async () => (await page.locator('#requests tr.request').count()) === curls.length, { message: `${curls.length} requests from the curl lines` });
  const smart = page.locator('#requests tr.request', { hasText: 'smart' });
  assert.match(await smart.innerText(), /smart → beta\/sim-small/, 'the smart request fell back to beta');
});
