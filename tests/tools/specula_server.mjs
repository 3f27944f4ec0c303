// Starts the real specula-server binary (SPECULA_SERVER) on loopback for the Node tests, with
// the HTTP API on an ephemeral port, and waits for its ready file.
import {spawn} from 'node:child_process';
import {existsSync, mkdtempSync, readFileSync, rmSync} from 'node:fs';
import {createRequire} from 'node:module';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

async function waitForReady(file, child) {
  const deadline = Date.now() + 120_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`specula-server exited with ${child.exitCode}`);
    if (existsSync(file)) return JSON.parse(readFileSync(file, 'utf8'));
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error('specula-server did not become ready');
}

// Returns {addresses, stop}.
export async function startServer(model, extraFlags = []) {
  const tmp = mkdtempSync(join(tmpdir(), 'specula_node_'));
  const ready = join(tmp, 'ready.json');
  const server = spawn(process.env.SPECULA_SERVER, [
    `--model=${model}`, '--listen=127.0.0.1:0', '--metrics-listen=',
    '--http-listen=127.0.0.1:0', `--ready-file=${ready}`, ...extraFlags,
  ], {stdio: ['ignore', 'ignore', 'inherit']});
  const addresses = await waitForReady(ready, server);
  return {
    addresses,
    stop() {
      server.kill('SIGTERM');
      rmSync(tmp, {recursive: true, force: true});
    },
  };
}

// A package of the npm fixtures fetched into `dir` (default OPENAI_SDK_DIR:
// tests/fixtures/fetch-openai-sdk.sh).
export function requireFixture(name, dir = process.env.OPENAI_SDK_DIR) {
  return createRequire(join(dir, 'node_modules', 'noop.js'))(name);
}

// The server on a scripted chat model (default SPECULA_CHAT_MODEL) and an official OpenAI SDK
// client of its HTTP API: {server, client, model}.
export async function startOpenAiServer(modelDir = process.env.SPECULA_CHAT_MODEL) {
  const OpenAI = requireFixture('openai');
  const server = await startServer(modelDir);
  const client = new OpenAI({baseURL: `http://${server.addresses.http_listen}/v1`,
                             apiKey: 'unused', maxRetries: 0});
  return {server, client, model: server.addresses.model};
}
