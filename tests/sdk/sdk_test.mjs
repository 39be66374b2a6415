// tests/sdk/sdk_test.mjs BASE_URL API_KEY — the official Anthropic and OpenAI SDKs against a
// running pensieve: plain, streaming, system prompt, multi-turn, stop sequences, count_tokens,
// models, and error cases (missing max_tokens, bad role, wrong key), asserting the shapes the
// SDKs expose. Prints `N passed, N failed, N skipped`.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const [base, key] = process.argv.slice(2);
let passed = 0, failed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error('FAIL:', what); } };
const expectStatus = async (fn, status, what) => {
  try { await fn(); check(false, `${what}: expected HTTP ${status}, got success`); }
  catch (e) { check(e.status === status, `${what}: status ${e.status} (${e.message})`); return e; }
};

const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
const openai = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0 });

async function anthropicTests() {
  const m = await anthropic.messages.create({ model: 'pensieve', max_tokens: 16, temperature: 0,
    messages: [{ role: 'user', content: 'Say hello.' }] });
  check(m.type === 'message' && m.role === 'assistant' && m.id.startsWith('msg_'), 'message shape');
  check(m.content[0].type === 'text' && typeof m.content[0].text === 'string', 'text block');
  check(['end_turn', 'max_tokens'].includes(m.stop_reason), 'stop_reason ' + m.stop_reason);
  check(m.usage.input_tokens > 0 && m.usage.output_tokens > 0, 'usage');

  // streaming through the SDK's event helpers gives the same text at temperature 0
  const stream = anthropic.messages.stream({ model: 'pensieve', max_tokens: 16, temperature: 0,
    messages: [{ role: 'user', content: 'Say hello.' }] });
  const types = [];
  stream.on('streamEvent', (ev) => types.push(ev.type));
  const final = await stream.finalMessage();
  check(final.content[0].text === m.content[0].text, 'streamed text equals plain text');
  check(types[0] === 'message_start' && types.at(-1) === 'message_stop', 'stream events ' + types.slice(0, 3).join(','));

  // system prompt and a multi-turn conversation
  const mt = await anthropic.messages.create({ model: 'pensieve', max_tokens: 8, system: 'You are terse.',
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'Again?' }] });
  check(mt.usage.input_tokens > m.usage.input_tokens, 'multi-turn prompt is longer');

  // stop sequence: take a word from the greedy answer and stop on it
  const text = m.content[0].text, words = text.split(' ').filter((w) => w.length >= 2);
  if (words.length) {
    const stop = words[Math.min(1, words.length - 1)];
    const s = await anthropic.messages.create({ model: 'pensieve', max_tokens: 16, temperature: 0, stop_sequences: [stop],
      messages: [{ role: 'user', content: 'Say hello.' }] });
    check(s.stop_reason === 'stop_sequence' && s.stop_sequence === stop && s.content[0].text === text.slice(0, text.indexOf(stop)),
      'stop sequence ' + JSON.stringify(s.content[0].text));
  }
  const ct = await anthropic.messages.countTokens({ model: 'pensieve', messages: [{ role: 'user', content: 'Say hello.' }] });
  check(ct.input_tokens === m.usage.input_tokens, 'count_tokens');
  const models = await anthropic.models.list();
  check(models.data.length === 1 && models.data[0].type === 'model', 'models.list');

  await expectStatus(() => anthropic.messages.create({ model: 'pensieve', messages: [{ role: 'user', content: 'x' }] }), 400, 'missing max_tokens');
  const e = await expectStatus(() => anthropic.messages.create({ model: 'pensieve', max_tokens: 4, messages: [{ role: 'bot', content: 'x' }] }), 400, 'bad role');
  check(e && e.error && e.error.type === 'error' && e.error.error.type === 'invalid_request_error', 'Anthropic error envelope');
  const wrong = new Anthropic({ baseURL: base, apiKey: key + 'x', maxRetries: 0 });
  await expectStatus(() => wrong.messages.create({ model: 'pensieve', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }), 401, 'wrong key');
}

async function openaiTests() {
  const c = await openai.chat.completions.create({ model: 'pensieve', max_tokens: 12, temperature: 0, seed: 7,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }] });
  check(c.object === 'chat.completion' && c.choices[0].message.role === 'assistant', 'chat completion shape');
  check(c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, 'usage');
  const st = await openai.chat.completions.create({ model: 'pensieve', max_tokens: 12, temperature: 0, seed: 7, stream: true,
    stream_options: { include_usage: true }, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }] });
  let text = '', usage = null;
  for await (const chunk of st) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === c.choices[0].message.content, 'streamed chat text equals plain');
  check(usage && usage.completion_tokens === c.usage.completion_tokens, 'stream usage');
  const mt = await openai.chat.completions.create({ model: 'pensieve', max_tokens: 4, stop: ['\n'],
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello' }, { role: 'user', content: 'More' }] });
  check(['stop', 'length'].includes(mt.choices[0].finish_reason), 'multi-turn with stop');
  const models = await openai.models.list();
  check(models.data[0].object === 'model', 'OpenAI models.list');
  await expectStatus(() => openai.chat.completions.create({ model: 'pensieve', messages: [{ role: 'wizard', content: 'x' }] }), 400, 'OpenAI bad role');
  const wrong = new OpenAI({ baseURL: base + '/v1', apiKey: 'nope', maxRetries: 0 });
  await expectStatus(() => wrong.chat.completions.create({ model: 'pensieve', messages: [{ role: 'user', content: 'x' }] }), 401, 'OpenAI wrong key');
}

try {
  await anthropicTests();
  await openaiTests();
} catch (e) {
  check(false, 'unexpected exception: ' + (e.stack || e));
}
console.log(`${passed} passed, ${failed} failed, 0 skipped`);
process.exit(failed ? 1 : 0);
