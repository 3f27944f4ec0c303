// specula's OpenAI-compatible HTTP API as OpenAI's users call it: the official OpenAI SDK for
// JavaScript (npm `openai`, fetched by tests/fixtures/fetch-openai-sdk.sh) against the real
// specula-server binary on loopback.
//
// The server runs the scripted chat model (engine/model/tiny/scripted_model.h) over the real
// Qwen3 tokenizer and chat template: whatever the conversation, its greedy answer is the Hermes
// tool call <tool_call>{"name":"get_weather", "arguments":{"days": 3}}</tool_call>. With tools in
// the request the server must return it as a parsed tool call; without, as plain content.
//
// Environment (CTest sets it): SPECULA_SERVER (binary), SPECULA_CHAT_MODEL (model directory),
// SPECULA_THINKING_MODEL (the scripted model that reasons first), OPENAI_SDK_DIR (the directory holding node_modules/openai). Run: node --test <this file>.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';

import {requireFixture, startOpenAiServer} from './specula_server.mjs';

const OpenAI = requireFixture('openai');
const Ajv2020 = requireFixture('ajv/dist/2020').default;
const addFormats = requireFixture('ajv-formats').default;

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The forecast for the next days.',
    parameters: {
      type: 'object',
      properties: {days: {type: 'integer', description: 'How many days.'}},
      required: ['days'],
    },
  },
}];
const MESSAGES = [
  {role: 'system', content: 'You are a weather bot.'},
  {role: 'user', content: 'Will it rain this week?'},
];

let server;
let client;
let model;

before(async () => {
  ({server, client, model} = await startOpenAiServer());
});

after(() => server?.stop());

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

test('chat without tools answers content (the call syntax is not parsed)', async () => {
  const r = await client.chat.completions.create({model, messages: MESSAGES, temperature: 0,
                                                  max_tokens: 40});
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.match(r.choices[0].message.content, /<tool_call>\{"name":"get_weather"/);
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.prompt_tokens > 10);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('chat with tools returns the parsed tool call', async () => {
  const r = await client.chat.completions.create({model, messages: MESSAGES, tools: TOOLS,
                                                  temperature: 0, max_tokens: 40});
  const message = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(message.content, null);
  assert.equal(message.tool_calls.length, 1);
  const call = message.tool_calls[0];
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), {days: 3});
});

test('streamed chat with tools: the call arrives parsed, never as content', async () => {
  const stream = await client.chat.completions.create({
    model, messages: MESSAGES, tools: TOOLS, temperature: 0, max_tokens: 40, stream: true,
    stream_options: {include_usage: true}});
  let content = '';
  const calls = [];
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      content += choice.delta.content ?? '';
      for (const c of choice.delta.tool_calls ?? []) calls.push(c);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(content, '');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].index, 0);
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), {days: 3});
  assert.equal(finish, 'tool_calls');
  assert.ok(usage && usage.completion_tokens > 0);
});

test('a tool-call round trip: the call and its result go back into the conversation', async () => {
  const first = await client.chat.completions.create({model, messages: MESSAGES, tools: TOOLS,
                                                      temperature: 0, max_tokens: 40});
  const call = first.choices[0].message.tool_calls[0];
  const followUp = [
    ...MESSAGES,
    first.choices[0].message,
    {role: 'tool', tool_call_id: call.id, content: '{"rain": [false, true, false]}'},
  ];
  const second = await client.chat.completions.create({model, messages: followUp, tools: TOOLS,
                                                       temperature: 0, max_tokens: 40});
  // The whole first exchange is in the prompt now: the call as the template renders it and the
  // tool's result.
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens + 20,
            `${second.usage.prompt_tokens} vs ${first.usage.prompt_tokens}`);
  assert.equal(second.choices[0].message.tool_calls[0].function.name, 'get_weather');
});

test('streaming and non-streaming give the same greedy content', async () => {
  const whole = await client.chat.completions.create({model, messages: MESSAGES, temperature: 0,
                                                      max_tokens: 12});
  const stream = await client.chat.completions.create({model, messages: MESSAGES, temperature: 0,
                                                       max_tokens: 12, stream: true});
  let content = '';
  for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(whole.choices[0].finish_reason, 'length');
});

test('completions continue the prompt text', async () => {
  // The script continues "<tool_call>" with {" name ":" get ...: four tokens, cut by max_tokens.
  const cut = await client.completions.create({model, prompt: '<tool_call>', max_tokens: 4,
                                               temperature: 0});
  assert.equal(cut.object, 'text_completion');
  assert.equal(cut.choices[0].text, '{"name":"get');
  assert.equal(cut.usage.completion_tokens, 4);
  assert.equal(cut.choices[0].finish_reason, 'length');
  // Room to finish: the rest of the script, ended by the model's end-of-turn token.
  const whole = await client.completions.create({model, prompt: '<tool_call>', max_tokens: 100,
                                                 temperature: 0});
  assert.equal(whole.choices[0].text, '{"name":"get_weather", "arguments":{"days": 3}}</tool_call>');
  assert.equal(whole.choices[0].finish_reason, 'stop');
});

test('logprobs', async () => {
  const r = await client.chat.completions.create({model, messages: MESSAGES, temperature: 0,
                                                  max_tokens: 3, logprobs: true, top_logprobs: 2});
  const entries = r.choices[0].logprobs.content;
  assert.equal(entries.length, 3);
  for (const e of entries) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
  }
});

test('bad requests raise the SDK\'s error types', async () => {
  await assert.rejects(
      client.chat.completions.create({model: 'no-such-model', messages: MESSAGES}),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(
      client.chat.completions.create({model, messages: MESSAGES, n: 2}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  await assert.rejects(
      client.chat.completions.create({model, messages: MESSAGES, temperature: 'hot'}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(
      client.chat.completions.create({model, messages: []}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
  await assert.rejects(
      client.chat.completions.create({model, messages: MESSAGES, tool_choice: 'required'}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice');
  await assert.rejects(
      client.chat.completions.create({model, messages: MESSAGES,
                                      response_format: {type: 'xml'}}),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.type');
  // The server still serves.
  const r = await client.chat.completions.create({model, messages: MESSAGES, max_tokens: 2});
  assert.equal(r.choices.length, 1);
});

// Structured outputs: the scripted model wants to answer a tool call, the response format forces a
// JSON text valid against the schema instead. Validated by ajv with ajv-formats (formats really
// checked), an independent implementation of JSON Schema. The scripted model does not reason, so
// these requests turn Qwen3's thinking off: with it on, the grammar takes a think block before the
// answer, and a model that wanders into one and never closes it runs to max_tokens (the reasoning
// test below covers that path).
const NO_THINKING = {enable_thinking: false};
const FORECAST_SCHEMA = {
  type: 'object',
  properties: {
    city: {type: 'string', maxLength: 12},
    unit: {type: 'string', enum: ['celsius', 'fahrenheit']},
    days: {type: 'array', items: {type: 'integer'}, minItems: 1, maxItems: 3},
    issued: {type: 'string', format: 'date-time'},
    id: {type: 'string', format: 'uuid'},
    note: {anyOf: [{type: 'string', maxLength: 6}, {type: 'null'}]},
  },
  required: ['city', 'unit', 'days', 'issued', 'id', 'note'],
  additionalProperties: false,
};

// One strict json_schema answer per [temperature, seed] of `runs`: each ends by itself and is
// valid for `ajv` (an independent validator).
async function assertAnswersValidate(ajv, name, schema, runs, maxTokens) {
  const validate = ajv.compile(schema);
  for (const [temperature, seed] of runs) {
    const r = await client.chat.completions.create({
      model, messages: MESSAGES, max_tokens: maxTokens, temperature, seed,
      response_format: {type: 'json_schema', json_schema: {name, schema, strict: true}},
      chat_template_kwargs: NO_THINKING,
    });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'stop', choice.message.content);
    const answer = JSON.parse(choice.message.content);
    assert.ok(validate(answer), `${choice.message.content}: ${ajv.errorsText(validate.errors)}`);
  }
}

test('response_format json_schema: the answer validates and ends by itself', async () => {
  const ajv = new Ajv2020({strict: false});
  addFormats(ajv);
  await assertAnswersValidate(ajv, 'forecast', FORECAST_SCHEMA, [[0, 1], [1, 2], [1, 3]], 400);
});

// The 50 agent-style schemas of the engine's end-rate test (tests/engine/grammar/
// agent_schemas.json), through the SDK, sent together so the server batches them, sampled at
// temperature 1 (under the mask the scripted model's answer is a random walk, as a random-weight
// model's): every answer that ends by itself is valid for ajv with formats, and at least 9 in 10
// end within 300 tokens (issue 38).
test('response_format json_schema on 50 agent schemas: answers validate, 9 in 10 end', async () => {
  const entries = JSON.parse(
      readFileSync(new URL('../engine/grammar/agent_schemas.json', import.meta.url), 'utf8'));
  assert.equal(entries.length, 50);
  const answers = await Promise.all(entries.map(async ({schema, strict}, i) => {
    const r = await client.chat.completions.create({
      model, messages: MESSAGES, max_tokens: 300, temperature: 1, seed: i + 1,
      response_format: {type: 'json_schema', json_schema: {name: `agent_${i}`, schema, strict}},
      chat_template_kwargs: NO_THINKING,
    });
    return r.choices[0];
  }));
  let ended = 0;
  answers.forEach((choice, i) => {
    if (choice.finish_reason === 'length') return;
    assert.equal(choice.finish_reason, 'stop', `schema ${i}`);
    ++ended;
    const ajv = new Ajv2020({strict: false});
    addFormats(ajv);
    const validate = ajv.compile(entries[i].schema);
    const answer = JSON.parse(choice.message.content);
    assert.ok(validate(answer),
              `schema ${i}: ${choice.message.content}: ${ajv.errorsText(validate.errors)}`);
  });
  assert.ok(ended >= 45, `${ended} of 50 answers ended within 300 tokens`);
});

test('response_format json_object: the answer is a JSON object', async () => {
  const stream = await client.chat.completions.create({
    model, messages: MESSAGES, max_tokens: 64, stream: true, seed: 1,
    response_format: {type: 'json_object'},
    chat_template_kwargs: NO_THINKING,
  });
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    assert.equal(choice.delta?.tool_calls, undefined, 'the answer is content, never a tool call');
    content += choice.delta?.content ?? '';
    finish = choice.finish_reason ?? finish;
  }
  // Unconstrained, the scripted model opens its answer with <tool_call>. 64 tokens may end inside
  // the object; what there is opens one (the text <tool_call> may still appear inside one of its
  // strings, which is valid JSON), and an answer that ends by itself parses as one.
  assert.match(content, /^\{/);
  if (finish === 'stop') assert.equal(typeof JSON.parse(content), 'object', content);
});

test('a schema keyword the server cannot honour is a 400 naming it', async () => {
  await assert.rejects(
      client.chat.completions.create({
        model, messages: MESSAGES,
        response_format: {type: 'json_schema', json_schema: {
          name: 'x', schema: {type: 'object', properties: {a: {type: 'integer', not: {const: 2}}}}}},
      }),
      (e) => e instanceof OpenAI.BadRequestError && /keyword 'not' is supported with a type/.test(e.message));
  await assert.rejects(
      client.chat.completions.create({
        model, messages: MESSAGES,
        response_format: {type: 'json_schema', json_schema: {
          name: 'x', schema: {type: 'string', pattern: '(a)\\1'}}},
      }),
      (e) => e instanceof OpenAI.BadRequestError && /backreferences \(\\1 \.\.\.\) are not supported/.test(e.message));
});

// The formats OpenAI's strict mode lists beyond date-time, email and uuid: ajv-formats checks each
// in full mode.
const NETWORK_SCHEMA = {
  type: 'object',
  properties: {
    v4: {type: 'string', format: 'ipv4'},
    v6: {type: 'string', format: 'ipv6'},
    host: {type: 'string', format: 'hostname'},
    ttl: {type: 'string', format: 'duration'},
  },
  required: ['v4', 'v6', 'host', 'ttl'],
  additionalProperties: false,
};

test('response_format json_schema with network formats: the answer validates', async () => {
  const ajv = new Ajv2020({strict: false});
  addFormats(ajv);
  await assertAnswersValidate(ajv, 'network', NETWORK_SCHEMA, [[0, 1], [1, 2], [1, 3], [1, 4]],
                              300);
});

// multipleOf (an integer divisor), with and without bounds, on integers and numbers: ajv checks
// each answer's arithmetic.
const MULTIPLES_SCHEMA = {
  type: 'object',
  properties: {
    dozen: {type: 'integer', multipleOf: 12, minimum: 0, maximum: 1000},
    angle: {type: 'number', multipleOf: 15, minimum: -180, exclusiveMaximum: 180},
    odd_seven: {type: 'integer', multipleOf: 7},
    thousands: {type: 'integer', multipleOf: 1000},
  },
  required: ['dozen', 'angle', 'odd_seven', 'thousands'],
  additionalProperties: false,
};

test('response_format json_schema with multipleOf: the answer validates', async () => {
  await assertAnswersValidate(new Ajv2020({strict: false}), 'multiples', MULTIPLES_SCHEMA,
                              [[0, 1], [1, 2], [1, 3], [1, 4]], 300);
});

// `pattern`: ajv checks it with JavaScript's own RegExp (the "u" flag), an engine independent of
// the server's regex compiler.
const CODES_SCHEMA = {
  type: 'object',
  properties: {
    code: {type: 'string', pattern: '^[A-Z]{3}-\\d{2,3}$'},
    tag: {type: 'string', pattern: '^(?:x|yy){1,3}[^\\s"]?$'},
    greek: {type: 'string', pattern: '^[α-ω]{1,4}$'},
  },
  required: ['code', 'tag', 'greek'],
  additionalProperties: false,
};

test('response_format json_schema with patterns: the answer validates', async () => {
  await assertAnswersValidate(new Ajv2020({strict: false}), 'codes', CODES_SCHEMA,
                              [[0, 1], [1, 2], [1, 3], [1, 4]], 300);
});

// vLLM's structured_outputs (the SDK passes the extra parameter through): a regex the whole
// answer matches, checked with JavaScript's RegExp; a choice among strings.
test('structured_outputs regex and choice hold the answer', async () => {
  const regex = '(?:[a-c]{2,4}|\\d{3})(?:-[xyz])?';
  for (const seed of [1, 2, 3]) {
    const r = await client.completions.create({
      model, prompt: 'Pick:', max_tokens: 40, temperature: 1, seed,
      structured_outputs: {regex},
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].text);
    assert.match(r.choices[0].text, new RegExp(`^(?:${regex})$`, 'u'));
  }
  const options = ['sunny', 'rain', 'snow and ice'];
  const r = await client.chat.completions.create({
    model, messages: MESSAGES, max_tokens: 40, temperature: 1, seed: 7,
    structured_outputs: {choice: options},
    chat_template_kwargs: NO_THINKING,
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(options.includes(r.choices[0].message.content), r.choices[0].message.content);
  await assert.rejects(
      client.completions.create({model, prompt: 'x', structured_outputs: {grammar: 'root ::= x'}}),
      (e) => e instanceof OpenAI.BadRequestError && /rule 'x' is used but not defined/.test(e.message));
});

// An EBNF grammar (GBNF): a recursive list the answer must be, checked by a parser of its own.
test('structured_outputs grammar holds the answer to a recursive grammar', async () => {
  const grammar = `
    root ::= list
    list ::= "[" (item ("," item){0,3})? "]"
    item ::= [0-9]{1,3} | list
  `;
  // The same language, parsed by hand: nesting to any depth, at most 4 items a list.
  const parse = (s) => {
    let i = 0;
    const item = () => {
      if (s[i] === '[') return list();
      const m = /^[0-9]{1,3}/.exec(s.slice(i));
      if (m) i += m[0].length;
      return m !== null;
    };
    const list = () => {
      if (s[i++] !== '[') return false;
      if (s[i] === ']') { ++i; return true; }
      for (let n = 0; n < 4; ++n) {
        if (!item()) return false;
        if (s[i] === ']') { ++i; return true; }
        if (s[i++] !== ',') return false;
      }
      return false;
    };
    return list() && i === s.length;
  };
  // Greedy must end (the model's scores tie, so the grammar alone decides); sampled answers that
  // end by themselves must parse (one cut by max_tokens inside a list proves nothing).
  for (const [temperature, seed] of [[0, 1], [1, 2], [1, 3], [1, 4], [1, 5]]) {
    const r = await client.completions.create({
      model, prompt: 'List:', max_tokens: 60, temperature, seed, structured_outputs: {grammar},
    });
    const {finish_reason: finish, text} = r.choices[0];
    if (temperature === 0) assert.equal(finish, 'stop', text);
    if (finish === 'stop') assert.ok(parse(text), text);
  }
});

// A reasoning model (the scripted thinking model, SPECULA_THINKING_MODEL: its greedy answer is
// "<think>Checking the forecast.</think>{"city": "Rome"}"): it reasons freely, and the answer
// after its think block follows the response format.
test('a reasoning model thinks, then its answer follows the response format', async () => {
  const thinking = await startOpenAiServer(process.env.SPECULA_THINKING_MODEL);
  try {
    const schema = {type: 'object', properties: {city: {type: 'string', enum: ['Paris', 'Rome']}},
                    required: ['city'], additionalProperties: false};
    const response_format = {type: 'json_schema', json_schema: {name: 'city', schema, strict: true}};
    const r = await thinking.client.chat.completions.create({
      model: thinking.model, messages: MESSAGES, temperature: 0, max_tokens: 60, response_format});
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.match(r.choices[0].message.reasoning_content, /^\s*Checking the forecast\.\s*$/);
    assert.deepEqual(JSON.parse(r.choices[0].message.content), {city: 'Rome'});
    // Thinking off: the template writes an empty block, so the answer holds from the first token
    // (the model's own "<think>" is refused).
    const off = await thinking.client.chat.completions.create({
      model: thinking.model, messages: MESSAGES, temperature: 0, max_tokens: 60, response_format,
      chat_template_kwargs: {enable_thinking: false}});
    assert.equal(off.choices[0].finish_reason, 'stop');
    assert.equal(off.choices[0].message.reasoning_content ?? '', '');
    assert.ok(['Paris', 'Rome'].includes(JSON.parse(off.choices[0].message.content).city));
  } finally {
    thinking.server.stop();
  }
});

// Strict tools: the scripted model wants to call get_weather with {"days": 3}; a strict schema
// that wants a city holds the call's arguments to it, whether the model opens the call itself
// (auto), the server opens it (required), or names it.
const STRICT_TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: {city: {type: 'string', enum: ['Paris', 'Rome']}},
      required: ['city'],
      additionalProperties: false,
    },
    strict: true,
  },
}];

test('strict tools: every call\'s arguments follow the schema', async () => {
  const ajv = new Ajv2020({strict: false});
  const validate = ajv.compile(STRICT_TOOLS[0].function.parameters);
  for (const tool_choice of ['auto', 'required', {type: 'function', function: {name: 'get_weather'}}]) {
    const r = await client.chat.completions.create({model, messages: MESSAGES, tools: STRICT_TOOLS,
                                                    tool_choice, temperature: 0, max_tokens: 60});
    const choice = r.choices[0];
    const label = JSON.stringify(tool_choice);
    assert.equal(choice.finish_reason, 'tool_calls', `${label}: ${JSON.stringify(choice)}`);
    const call = choice.message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `${label}: ${call.function.arguments}`);
  }
  // The same tool without strict: the model's own arguments, which the schema would refuse.
  const free = structuredClone(STRICT_TOOLS);
  free[0].function.strict = false;
  const r = await client.chat.completions.create({model, messages: MESSAGES, tools: free,
                                                  temperature: 0, max_tokens: 60});
  assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), {days: 3});
});

test('a strict tool whose schema cannot be honoured is a 400 naming the keyword', async () => {
  const tools = structuredClone(STRICT_TOOLS);
  tools[0].function.parameters.properties.city = {type: 'string', format: 'iri'};
  await assert.rejects(
      client.chat.completions.create({model, messages: MESSAGES, tools, max_tokens: 5}),
      (e) => e instanceof OpenAI.BadRequestError && /strict tool 'get_weather'/.test(e.message) &&
             /format 'iri'/.test(e.message));
});
