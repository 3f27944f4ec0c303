// Real agent frameworks as clients (issue 39): each runs its own multi-turn tool-calling loop
// against the real specula-server on loopback, and the loop must end with the model's answer.
//
// The server runs the scripted *agent* model (engine/model/tiny/scripted_model.h, two scripts):
// it calls get_weather({"days": 3}) until the conversation holds a tool's result (the
// `</tool_response>` token of the Qwen3 template), then answers "It will rain on Tuesday." So the
// answer proves the tool's result reached the model, and a framework that lost it would loop
// until its step limit.
//
// Each framework's own tool helper builds the schema (zod), as an application would; the Agents
// SDK marks its tools strict, so the call runs under the grammar. Tracing and telemetry stay off:
// nothing leaves loopback.
//
// Environment (CTest sets it): SPECULA_SERVER, SPECULA_AGENT_MODEL, AGENT_FRAMEWORKS_DIR.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';

import {requireFixture, startServer} from './specula_server.mjs';

const dir = process.env.AGENT_FRAMEWORKS_DIR;
const need = (name) => requireFixture(name, dir);
const {z} = need('zod');

const QUESTION = 'Will it rain this week?';
const ANSWER = 'It will rain on Tuesday.';
const FORECAST = JSON.stringify({rain: [false, true, false]});

let server;
let baseURL;
let model;

before(async () => {
  server = await startServer(process.env.SPECULA_AGENT_MODEL);
  baseURL = `http://${server.addresses.http_listen}/v1`;
  model = server.addresses.model;
});

after(() => server?.stop());

test('OpenAI Agents SDK: run() over the Responses API calls the tool and answers', async () => {
  const {Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled} = need('@openai/agents');
  const OpenAI = need('openai');
  setTracingDisabled(true);
  setDefaultOpenAIClient(new OpenAI({baseURL, apiKey: 'unused', maxRetries: 0}));
  const calls = [];
  const getWeather = tool({
    name: 'get_weather',
    description: 'The forecast for the next days.',
    parameters: z.object({days: z.number().int()}),
    execute: async ({days}) => {
      calls.push(days);
      return FORECAST;
    },
  });
  const agent = new Agent({name: 'weather', instructions: 'You are a weather bot.', model,
                           tools: [getWeather], modelSettings: {temperature: 0}});
  const result = await run(agent, QUESTION, {maxTurns: 4});
  assert.equal(result.finalOutput, ANSWER);
  assert.deepEqual(calls, [3]);
});

test('Vercel AI SDK: streamText with tools over chat completions loops to the answer', async () => {
  const {streamText, tool, stepCountIs} = need('ai');
  const {createOpenAICompatible} = need('@ai-sdk/openai-compatible');
  const specula = createOpenAICompatible({name: 'specula', baseURL, apiKey: 'unused'});
  const calls = [];
  const result = streamText({
    model: specula(model),
    prompt: QUESTION,
    temperature: 0,
    stopWhen: stepCountIs(4),
    tools: {
      get_weather: tool({
        description: 'The forecast for the next days.',
        inputSchema: z.object({days: z.number().int()}),
        execute: async ({days}) => {
          calls.push(days);
          return FORECAST;
        },
      }),
    },
  });
  assert.equal(await result.text, ANSWER);
  assert.deepEqual(calls, [3]);
  assert.equal((await result.steps).length, 2);
});

test('LangChain.js: ChatOpenAI.bindTools, the tool\'s message, then the answer', async () => {
  const {ChatOpenAI} = need('@langchain/openai');
  const {tool} = need('@langchain/core/tools');
  const {HumanMessage} = need('@langchain/core/messages');
  const calls = [];
  const getWeather = tool(async ({days}) => {
    calls.push(days);
    return FORECAST;
  }, {name: 'get_weather', description: 'The forecast for the next days.',
      schema: z.object({days: z.number().int()})});
  const llm = new ChatOpenAI({model, apiKey: 'unused', temperature: 0, maxRetries: 0,
                              configuration: {baseURL}}).bindTools([getWeather]);
  const messages = [new HumanMessage(QUESTION)];
  for (let turn = 0; turn < 4; ++turn) {
    const reply = await llm.invoke(messages);
    messages.push(reply);
    if (!reply.tool_calls?.length) break;
    for (const call of reply.tool_calls) messages.push(await getWeather.invoke(call));
  }
  assert.equal(messages.at(-1).content, ANSWER);
  assert.deepEqual(calls, [3]);
});
