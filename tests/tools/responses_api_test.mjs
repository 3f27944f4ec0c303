// The Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) as OpenAI's users
// call it: the official OpenAI SDK for JavaScript (npm `openai`) against the real specula-server
// on loopback, running the scripted chat model (its greedy answer to any conversation is the
// Hermes call <tool_call>{"name":"get_weather", "arguments":{"days": 3}}</tool_call>).
//
// An agent's loop: each turn sends only its new items (the tool's output) and the previous
// response's id; the server rebuilds the conversation from its stored responses and reuses their
// KV, so each turn prefills only the new items and the template's glue.
//
// Environment (CTest sets it): SPECULA_SERVER, SPECULA_CHAT_MODEL, OPENAI_SDK_DIR.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';

import {requireFixture, startOpenAiServer} from './specula_server.mjs';

const OpenAI = requireFixture('openai');

const TOOLS = [{
  type: 'function',
  name: 'get_weather',
  description: 'The forecast for the next days.',
  parameters: {
    type: 'object',
    properties: {days: {type: 'integer', description: 'How many days.'}},
    required: ['days'],
  },
  strict: false,
}];
const INSTRUCTIONS = 'You are a weather bot.';

let server;
let client;
let model;

before(async () => {
  ({server, client, model} = await startOpenAiServer());
});

after(() => server?.stop());

function ask(extra) {
  return client.responses.create({model, instructions: INSTRUCTIONS, tools: TOOLS,
                                  temperature: 0, max_output_tokens: 40, ...extra});
}

function onlyCallNamed(response, name) {
  assert.equal(response.status, 'completed');
  const calls = response.output.filter((item) => item.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(response.output));
  assert.equal(calls[0].name, name);
  assert.match(calls[0].call_id, /^call_/);
  return calls[0];
}

// The scripted model's own call (the tools below are not strict).
function onlyCall(response) {
  const call = onlyCallNamed(response, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), {days: 3});
  return call;
}

function toolOutput(call, output) {
  return [{type: 'function_call_output', call_id: call.call_id, output}];
}

test('a response: its function call as an output item, usage, the request echoed', async () => {
  const r = await ask({input: 'Will it rain this week?'});
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_[0-9a-f]{48}$/);
  assert.equal(r.model, model);
  onlyCall(r);
  assert.equal(r.instructions, INSTRUCTIONS);
  assert.equal(r.tools[0].name, 'get_weather');
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(r.usage.output_tokens > 0);
  // Without tools the same text is a message.
  const plain = await client.responses.create({model, input: 'hi', temperature: 0,
                                               max_output_tokens: 40});
  assert.match(plain.output_text, /<tool_call>\{"name":"get_weather"/);
  assert.equal(plain.output[0].type, 'message');
  assert.equal(plain.output[0].role, 'assistant');
});

// The agent loop of the Agents SDK: each turn sends the tool's output and the previous id only.
test('previous_response_id: each turn prefills only its new items', async () => {
  let r = await ask({input: 'Will it rain this week?'});
  const turns = [r];
  for (let turn = 1; turn <= 3; ++turn) {
    const call = onlyCall(r);
    r = await ask({previous_response_id: r.id,
                   input: toolOutput(call, `{"rain": [${turn}, false, true]}`)});
    turns.push(r);
  }
  for (let t = 1; t < turns.length; ++t) {
    const before = turns[t - 1].usage;
    const now = turns[t].usage;
    const cached = now.input_tokens_details.cached_tokens;
    // Everything the previous turn prefilled is reused; what is left is the previous answer as
    // the template renders it, the tool's output and the glue around them.
    assert.ok(cached >= before.input_tokens, `turn ${t}: ${cached} cached of ${now.input_tokens}, ` +
              `the previous turn had ${before.input_tokens}`);
    assert.ok(now.input_tokens - cached <= 60,
              `turn ${t}: ${now.input_tokens - cached} tokens prefilled`);
    assert.ok(now.input_tokens > before.input_tokens);
  }
  // The conversation the server rebuilt is the one a client would send whole (store: false,
  // every item given): the same prompt.
  const whole = [{role: 'user', content: 'Will it rain this week?'}];
  for (let t = 0; t < 3; ++t) {
    const call = onlyCall(turns[t]);
    whole.push({type: 'function_call', call_id: call.call_id, name: call.name,
                arguments: call.arguments});
    whole.push(...toolOutput(call, `{"rain": [${t + 1}, false, true]}`));
  }
  const stateless = await ask({input: whole, store: false});
  assert.equal(stateless.usage.input_tokens, turns[3].usage.input_tokens);
});

test('two requests continuing one response are both served (a branch)', async () => {
  const root = await ask({input: 'Will it rain this week?'});
  const call = onlyCall(root);
  const [a, b] = await Promise.all([
    ask({previous_response_id: root.id, input: toolOutput(call, 'sunny')}),
    ask({previous_response_id: root.id, input: toolOutput(call, 'rainy')}),
  ]);
  onlyCall(a);
  onlyCall(b);
  assert.notEqual(a.id, b.id);
  assert.equal(a.previous_response_id, root.id);
});

test('streaming: OpenAI\'s events, in order, ending with response.completed', async () => {
  const stream = await ask({input: 'Will it rain this week?', stream: true});
  const types = [];
  let sequence = 0;
  let completed = null;
  let args = '';
  for await (const event of stream) {
    types.push(event.type);
    assert.equal(event.sequence_number, sequence++);
    if (event.type === 'response.function_call_arguments.delta') args += event.delta;
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(types.includes('response.output_item.added'));
  assert.ok(types.includes('response.function_call_arguments.done'));
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(JSON.parse(args), {days: 3});
  onlyCall(completed);
  // The streamed response is stored like any other.
  const again = await client.responses.retrieve(completed.id);
  assert.deepEqual(again.output, completed.output);
});

test('retrieve and delete; store: false is not kept; unknown ids are 404 naming them', async () => {
  const r = await ask({input: 'hi'});
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.deepEqual(got.output, r.output);
  await client.responses.del(r.id);
  await assert.rejects(client.responses.retrieve(r.id),
                       (e) => e instanceof OpenAI.NotFoundError && e.message.includes(r.id));
  await assert.rejects(ask({previous_response_id: r.id, input: 'more'}),
                       (e) => e instanceof OpenAI.NotFoundError &&
                              e.param === 'previous_response_id');
  const unstored = await ask({input: 'hi', store: false});
  await assert.rejects(client.responses.retrieve(unstored.id),
                       (e) => e instanceof OpenAI.NotFoundError);
});

test('what cannot be honoured is a 400 naming the parameter', async () => {
  await assert.rejects(
      ask({input: 'hi', tools: [{type: 'web_search_preview'}]}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type');
  await assert.rejects(
      ask({input: 'hi', truncation: 'auto'}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'truncation');
  await assert.rejects(
      ask({input: [{role: 'user', content: [{type: 'input_image', image_url: 'x'}]}]}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].content[0]');
});

// Function tools are strict by default in the Responses API (the Agents SDK relies on it): the
// call's arguments follow the schema although the model wants {"days": 3}.
test('function tools are strict unless they say otherwise', async () => {
  const tools = [{type: 'function', name: 'get_weather',
                  parameters: {type: 'object', properties: {city: {enum: ['Paris', 'Rome']}},
                               required: ['city'], additionalProperties: false}}];
  const r = await client.responses.create({model, input: 'Will it rain?', tools, temperature: 0,
                                           max_output_tokens: 60});
  const call = onlyCallNamed(r, 'get_weather');
  assert.ok(['Paris', 'Rome'].includes(JSON.parse(call.arguments).city), call.arguments);
  assert.equal(r.tools[0].strict, true);
});

test('text.format json_schema constrains the answer', async () => {
  const schema = {type: 'object', properties: {rain: {type: 'boolean'}}, required: ['rain'],
                  additionalProperties: false};
  const r = await client.responses.create({
    model, input: 'Will it rain?', max_output_tokens: 40,
    text: {format: {type: 'json_schema', name: 'answer', schema, strict: true}},
    // The scripted model does not reason: thinking off, so the answer starts at once.
    reasoning: {effort: 'none'},
  });
  assert.equal(r.status, 'completed');
  assert.equal(typeof JSON.parse(r.output_text).rain, 'boolean');
});
