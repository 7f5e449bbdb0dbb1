#!/usr/bin/env node
// A tiny OpenAI-compatible upstream for rota's end-to-end tests, on 127.0.0.1 only.
//
//   node upstream.mjs [--port P]
//
// prints {"url": "http://127.0.0.1:P"} on stdout once it listens.
//
//   POST /v1/chat/completions   a chat completion with usage (an SSE stream when "stream": true),
//                               unless a scripted reply is queued for the caller's token
//   GET  /v1/models             one model list
//   POST /__script {"token_prefix"?: "...", "replies": [{"status", "headers"?, "body"?}]}
//                               queues replies for calls whose bearer token starts with
//                               token_prefix (any call without it); when the queue is empty, 200s
//   DELETE /__script            drops every queued reply
//   POST /codex/responses       the ChatGPT Codex backend (a codex provider's base_url is
//                               UPSTREAM/codex): a Bearer JWT whose claim
//                               `https://api.openai.com/auth`.chatgpt_account_id equals the
//                               `chatgpt-account-id` header (else 401 / 400), a body with
//                               store: false, stream: true and non-empty instructions (else 400
//                               {"detail"}); answers a Responses SSE stream ("hello from codex")
//                               with the plan's x-codex-primary-* headers
//   GET  /__seen                [{path, authorization, model, status, at, account_id?}] of every
//                               completion or codex call, oldest first (status: what this
//                               upstream answered; account_id: the chatgpt-account-id header)
//   DELETE /__seen              forgets them
//   POST /token                 Google's token endpoint for service accounts, as a fake: a form
//                               with the JWT-bearer grant whose RS256 assertion verifies with the
//                               public key of tests/fixtures/service-accounts/a.pem, `aud` this
//                               URL, `iat`/`exp` at most an hour apart -> {access_token, expires_in};
//                               else 400 invalid_grant
//   GET  /__issued              the access tokens /token granted, oldest first

import { createPublicKey, createVerify } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values: argv } = parseArgs({ options: { port: { type: 'string', default: '0' } } });

const scripts = []; // [{prefix: string|undefined, replies: [...]}], checked in order
const seen = [];
const issued = [];
let nextId = 1;
const serviceAccountKey = createPublicKey(readFileSync(new URL('../fixtures/service-accounts/a.pem', import.meta.url)));

/** A service account's JWT assertion checked as Google checks it; the reason when it fails. */
function refusal(assertion, audience) {
  const [header, claims, signature] = String(assertion).split('.');
  if (!signature) return 'Invalid JWT: not a JWT.';
  const verify = createVerify('RSA-SHA256');
  verify.update(`${header}.${claims}`);
  if (!verify.verify(serviceAccountKey, Buffer.from(signature, 'base64url'))) return 'Invalid JWT Signature.';
  const c = JSON.parse(Buffer.from(claims, 'base64url').toString());
  const now = Math.floor(Date.now() / 1000);
  if (c.aud !== audience || !c.iss || Math.abs(c.iat - now) > 60 || c.exp <= c.iat || c.exp - c.iat > 3600) {
    return 'Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.';
  }
  return null;
}

function json(res, status, value, headers = {}) {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

async function readJson(req) {
  const text = await readBody(req);
  return text ? JSON.parse(text) : {};
}

function bearer(authorization) {
  const m = /^Bearer\s+(.+)$/i.exec(authorization ?? '');
  return m ? m[1].trim() : '';
}

// The first queued reply whose prefix matches the token, taken off its queue.
function scripted(token) {
  for (const s of scripts) {
    if (s.replies.length && (s.prefix === undefined || token.startsWith(s.prefix))) {
      return s.replies.shift();
    }
  }
  return undefined;
}

function completion(model, content) {
  return {
    id: `chatcmpl-test-${nextId++}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop', logprobs: null }],
    usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 },
  };
}

function stream(res, model, content) {
  const id = `chatcmpl-test-${nextId++}`;
  const created = Math.floor(Date.now() / 1000);
  const chunk = (delta, finish, usage) => `data: ${JSON.stringify({
    id, object: 'chat.completion.chunk', created, model,
    choices: usage ? [] : [{ index: 0, delta, finish_reason: finish }],
    ...(usage ? { usage } : {}),
  })}\n\n`;
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  res.write(chunk({ role: 'assistant', content: '' }, null));
  res.write(chunk({ content }, null));
  res.write(chunk({}, 'stop'));
  res.write(chunk(null, null, { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 }));
  res.end('data: [DONE]\n\n');
}

/** The claims of a JWT's payload, or undefined. */
function claimsOf(token) {
  try {
    const claims = JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString('utf8'));
    return claims && typeof claims === 'object' ? claims : undefined;
  } catch {
    return undefined;
  }
}

/**
 * POST /codex/responses, as chatgpt.com/backend-api/codex answers: the ChatGPT access token and
 * its account's header, the backend's request rules, then a Responses stream.
 */
async function codex(req, res, url) {
  const text = await readBody(req);
  const token = bearer(req.headers.authorization);
  const accountId = req.headers['chatgpt-account-id'] ?? null;
  const record = (status, model = null) => {
    seen.push({ path: url.pathname, authorization: req.headers.authorization ?? null, model, status, at: Date.now(), account_id: accountId });
  };
  const detail = (status, message, model) => {
    record(status, model);
    return json(res, status, { detail: message });
  };
  const claims = token ? claimsOf(token) : undefined;
  const account = claims?.['https://api.openai.com/auth']?.chatgpt_account_id;
  if (!account) return detail(401, 'Could not parse your authentication token. Please try signing in again.');
  if (accountId !== account) return detail(400, accountId ? 'The chatgpt-account-id header does not match the token\'s account.' : 'Missing chatgpt-account-id header.');
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    return detail(400, 'Invalid JSON body.');
  }
  if (body.store !== false) return detail(400, 'Store must be set to false', body.model);
  if (body.stream !== true) return detail(400, 'Stream must be set to true', body.model);
  if (typeof body.instructions !== 'string' || !body.instructions.trim()) return detail(400, 'Instructions are required', body.model);
  record(200, body.model ?? null);
  const id = `resp_test_${nextId++}`;
  const created = Math.floor(Date.now() / 1000);
  const content = 'hello from codex';
  const message = (status, parts) => ({ id: `msg_${id}`, type: 'message', status, role: 'assistant', content: parts });
  const response = (status, output, usage = null) => ({
    id, object: 'response', created_at: created, status, model: body.model, instructions: body.instructions, output, usage,
    store: false, parallel_tool_calls: true, tool_choice: 'auto', tools: [],
  });
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    'x-codex-primary-used-percent': '12.5',
    'x-codex-primary-window-minutes': '300',
    'x-codex-primary-reset-after-seconds': '9000',
  });
  let sequence = 0;
  const event = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...data })}\n\n`);
  event('response.created', { response: response('in_progress', []) });
  event('response.output_item.added', { output_index: 0, item: message('in_progress', []) });
  event('response.output_text.delta', { item_id: `msg_${id}`, output_index: 0, content_index: 0, delta: content });
  event('response.completed', {
    response: response('completed', [message('completed', [{ type: 'output_text', text: content, annotations: [] }])], {
      input_tokens: 7, input_tokens_details: { cached_tokens: 0 }, output_tokens: 3, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 10,
    }),
  });
  res.end();
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://127.0.0.1');
  if (req.method === 'POST' && url.pathname === '/v1/chat/completions') {
    let body;
    try {
      body = await readJson(req);
    } catch {
      return json(res, 400, { error: { message: 'body is not JSON', type: 'invalid_request_error' } });
    }
    const token = bearer(req.headers.authorization);
    const reply = scripted(token);
    const status = reply?.status ?? 200;
    seen.push({ path: url.pathname, authorization: req.headers.authorization ?? null, model: body.model ?? null, status, at: Date.now() });
    if (reply) {
      const payload = reply.body ?? { error: { message: `scripted ${status}`, type: 'scripted' } };
      return json(res, status, payload, reply.headers ?? {});
    }
    if (!token) {
      return json(res, 401, { error: { message: 'no bearer token', type: 'invalid_request_error', code: 'invalid_api_key' } });
    }
    const content = `hello from the test upstream (${body.model})`;
    return body.stream ? stream(res, body.model, content) : json(res, 200, completion(body.model, content));
  }
  if (req.method === 'POST' && url.pathname === '/codex/responses') return codex(req, res, url);
  if (req.method === 'POST' && url.pathname === '/token') {
    const form = new URLSearchParams(await readBody(req));
    if (!String(req.headers['content-type']).startsWith('application/x-www-form-urlencoded')
        || form.get('grant_type') !== 'urn:ietf:params:oauth:grant-type:jwt-bearer') {
      return json(res, 400, { error: 'unsupported_grant_type' });
    }
    const why = refusal(form.get('assertion'), `http://${req.headers.host}/token`);
    if (why) return json(res, 400, { error: 'invalid_grant', error_description: why });
    const token = `ya29.browser-test-${issued.length + 1}`;
    issued.push(token);
    return json(res, 200, { access_token: token, expires_in: 3599, token_type: 'Bearer' });
  }
  if (req.method === 'GET' && url.pathname === '/__issued') return json(res, 200, issued);
  if (req.method === 'GET' && url.pathname === '/v1/models') {
    return json(res, 200, { object: 'list', data: [{ id: 'gpt-4o-mini', object: 'model', owned_by: 'test' }] });
  }
  if (url.pathname === '/__script') {
    if (req.method === 'DELETE') {
      scripts.length = 0;
      return json(res, 200, { ok: true });
    }
    if (req.method === 'POST') {
      const s = await readJson(req);
      if (!Array.isArray(s.replies)) return json(res, 400, { error: 'replies must be an array' });
      scripts.push({ prefix: s.token_prefix, replies: [...s.replies] });
      return json(res, 200, { queued: s.replies.length });
    }
  }
  if (url.pathname === '/__seen') {
    if (req.method === 'GET') return json(res, 200, seen);
    if (req.method === 'DELETE') {
      seen.length = 0;
      return json(res, 200, { ok: true });
    }
  }
  return json(res, 404, { error: { message: `no route ${req.method} ${url.pathname}`, type: 'not_found' } });
}

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => json(res, 500, { error: { message: String(err), type: 'test_upstream' } }));
});
server.listen(Number(argv.port), '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${server.address().port}` })}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
