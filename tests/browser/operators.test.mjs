// People sign in to the console through the real OpenID provider (`[console.sso]`), once per
// role: a viewer sees everything and can change nothing (no button to, and the API answers 403),
// an operator runs the accounts but cannot create agents, an admin can; every change lands in
// `admin_actions` with the person's email and role, and signing out ends the session at once.

import assert from 'node:assert/strict';

import { docShot, e2e, idpLogin, newPage, waitUntil } from './harness.mjs';

const sso = ({ idp }) => `
[console.sso]
issuer = "${idp.issuer}"
client_id = "rota"
client_secret_env = "CORP_CLIENT_SECRET"
scopes = ["openid", "email"]
label = "Sign in with Example ID"
[console.sso.roles]
admin = ["alice@example.com"]
operator = ["olivia@example.com"]
viewer = ["*@example.com"]
`;

/** Signs `login` in through the sign-in page's SSO button; returns the session (GET /api/v1/session). */
async function ssoSignIn(env, login) {
  const page = await newPage(env.browser);
  await page.goto(`${env.rota.url}/ui/`);
  const button = page.locator('a#sso');
  assert.equal((await button.innerText()).trim(), 'Sign in with Example ID');
  if (login === 'vera') await docShot(page, 'operations-sign-in');
  await button.click();
  await idpLogin(page, env.idp, login);
  await page.locator('body[data-ready="true"]').waitFor({ state: 'attached' });
  const session = await page.evaluate(async () => (await fetch('/api/v1/session')).json());
  return { page, session };
}

/** A call of the admin API from the page, with its session cookie and CSRF token. */
async function fromPage(page, method, path, body) {
  return page.evaluate(async ({ method, path, body }) => {
    const { csrf } = await (await fetch('/api/v1/session')).json();
    const r = await fetch(path, {
      method,
      headers: { 'content-type': 'application/json', 'x-csrf-token': csrf },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: r.status, json: await r.json().catch(() => null) };
  }, { method, path, body });
}

e2e('people sign in with their identity provider, each with their role; every change is recorded as theirs', { extraToml: sso, timeoutMs: 120_000 }, async (t, env) => {
  const { rota } = env;
  for (const name of ['one', 'two']) {
    const r = await rota.api('POST', '/api/v1/profiles', { body: { provider: 'corp', name, secret: `sk-corp-${name}-0001` } });
    assert.equal(r.status, 201, r.text);
  }

  // A viewer: everything shown, no button that changes anything, and the API refuses.
  const viewer = await ssoSignIn(env, 'vera');
  assert.deepEqual([viewer.session.agent, viewer.session.kind, viewer.session.role], ['vera@example.com', 'person', 'viewer']);
  const v = viewer.page;
  assert.equal((await v.locator('#agent').innerText()).trim(), 'vera@example.com · viewer');
  await v.locator('#tab-profiles').click();
  await v.locator('tr[data-profile="corp:one"]').waitFor();
  assert.equal(await v.locator('#view-profiles .actions button').count(), 0, 'no way to add an account');
  assert.equal(await v.locator('#view-profiles .row-actions button').count(), 0, 'no row action');
  await docShot(v, 'operations-viewer');
  await v.locator('#tab-agents').click();
  await v.locator('#agents tr[data-agent="ops"]').waitFor();
  assert.ok(await v.locator('#agent-new').isHidden(), 'no new-agent form');
  assert.equal(await v.locator('#agents button[data-action="revoke"]').count(), 0);
  for (const [method, path, body] of [
    ['POST', '/api/v1/profiles/corp:one/disable'],
    ['POST', '/api/v1/profiles', { provider: 'corp', name: 'x', secret: 'sk-x-0001' }],
    ['POST', '/api/v1/agents', { name: 'sneaky' }],
    ['DELETE', '/api/v1/providers/corp/order'],
  ]) {
    const r = await fromPage(v, method, path, body);
    assert.equal(r.status, 403, `${method} ${path}: ${JSON.stringify(r.json)}`);
    assert.match(r.json.error.message, /person vera@example\.com has the viewer role; this needs (operator|admin)/);
  }
  assert.equal((await fromPage(v, 'GET', '/api/v1/admin-actions')).status, 200, 'a viewer reads the changes');

  // An operator: runs the accounts, cannot create agents.
  const operator = await ssoSignIn(env, 'olivia');
  assert.equal(operator.session.role, 'operator');
  const o = operator.page;
  await o.locator('#tab-profiles').click();
  const one = o.locator('tr[data-profile="corp:one"]');
  await one.locator('[data-action="disable"]').click();
  await waitUntil(async () => (await one.getAttribute('data-state')) === 'disabled' || (await rota.profile('corp:one')).enabled === false, { message: 'corp:one disabled' });
  assert.equal(await one.locator('[data-action="delete"]').count(), 0, 'deleting is an admin\'s');
  await o.locator('#tab-agents').click();
  assert.ok(await o.locator('#agent-new').isHidden());
  const refused = await fromPage(o, 'POST', '/api/v1/agents', { name: 'sneaky' });
  assert.equal(refused.status, 403, JSON.stringify(refused.json));
  assert.equal((await fromPage(o, 'DELETE', '/api/v1/profiles/corp:two')).status, 403);

  // An admin: creates an agent from the console.
  const admin = await ssoSignIn(env, 'alice');
  assert.equal(admin.session.role, 'admin');
  const a = admin.page;
  await a.locator('#tab-agents').click();
  await a.locator('#agent-name').fill('planner');
  await a.locator('#agent-create').click();
  await a.locator('#new-key').waitFor();

  // Every change, as whose it was.
  const all = (await rota.api('GET', '/api/v1/admin-actions')).json;
  // The harness made the admin agent with the CLI: a row of the OS user's.
  assert.deepEqual(all.filter((x) => x.actor_kind === 'cli').map((x) => `${x.action} ${x.target}`), ['agent.create ops']);
  const actions = all.filter((x) => x.actor_kind !== 'cli');
  const seen = actions.map((x) => `${x.actor_email ?? x.actor} ${x.actor_kind} ${x.role} ${x.action} ${x.target}`);
  assert.deepEqual(seen, [
    'alice@example.com person admin agent.create planner',
    'alice@example.com person admin session.sign_in null',
    'olivia@example.com person operator profile.disable corp:one',
    'olivia@example.com person operator session.sign_in null',
    'vera@example.com person viewer session.sign_in null',
    'ops agent admin profile.add corp:two',
    'ops agent admin profile.add corp:one',
  ]);
  assert.equal(actions[0].actor, `${env.idp.issuer} alice`, 'the actor is the verified subject');
  assert.ok(!JSON.stringify(actions).includes('sk-corp-one-0001'), 'no secret in the recorded values');
  const disabled = actions[2];
  assert.equal(disabled.before.enabled, true);
  assert.equal(disabled.after.enabled, false);
  await a.locator('#tab-changes').click();
  await a.locator('#changes tr[data-action="agent.create"][data-actor="alice@example.com"]').waitFor();
  assert.match(await a.locator('#changes tr[data-action="profile.disable"]').innerText(), /olivia@example\.com/);
  await docShot(a, 'operations-changes');

  // Signing out ends the session at once: its cookie opens nothing any more.
  const cookie = (await o.context().cookies()).find((c) => c.name === 'rota_session');
  assert.ok(cookie, 'the operator holds a session cookie');
  await o.locator('#sign-out').click();
  await o.locator('a#sso').waitFor();
  const after = await rota.api('GET', '/api/v1/profiles', { key: null, cookie: `rota_session=${cookie.value}` });
  assert.equal(after.status, 401, after.text);
});

e2e('a person the configuration gives no role cannot sign in', { extraToml: (env) => sso(env).replace('viewer = ["*@example.com"]', 'viewer = []'), timeoutMs: 60_000 }, async (t, env) => {
  const page = await newPage(env.browser);
  await page.goto(`${env.rota.url}/ui/`);
  await page.locator('a#sso').click();
  await idpLogin(page, env.idp, 'mallory');
  const error = page.locator('#error');
  await error.waitFor();
  assert.match(await error.innerText(), /mallory@example\.com signed in, but \[console\.sso\] gives them no role/);
  assert.equal((await page.context().cookies()).filter((c) => c.name === 'rota_session').length, 0, 'no session');
});

e2e('only an identity the provider verified gets a role', { extraToml: (env) => sso(env).replace('scopes = ["openid", "email"]', 'scopes = ["openid", "email", "profile"]'), timeoutMs: 90_000 }, async (t, env) => {
  for (const login of ['unverified-ua', 'stringfalse-sf', 'username-un']) {
    const page = await newPage(env.browser);
    await page.goto(`${env.rota.url}/ui/`);
    await page.locator('a#sso').click();
    await idpLogin(page, env.idp, login);
    const error = page.locator('#error');
    await error.waitFor();
    assert.match(await error.innerText(), /gives them no role \(the provider vouched for no email of theirs\)/, login);
    assert.equal((await page.context().cookies()).filter((c) => c.name === 'rota_session').length, 0, `${login}: no session`);
    await page.close();
  }
  const verified = await ssoSignIn(env, 'vera');
  assert.deepEqual([verified.session.agent, verified.session.role], ['vera@example.com', 'viewer']);
});
