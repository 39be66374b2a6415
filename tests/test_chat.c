// tests/test_chat.c — chat templates: the 58 conformance cases of ../shared/conformance/chat,
// recognition of real models' Jinja templates, the reference models' chat prompts (text and
// token ids), embedded cases that need no ../shared (multi-turn, system, trailing assistant, no
// generation prompt), Qwen3 thinking rules, message spans, the BOS rule, special tokens in
// content, errors and the `template` CLI's failures.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

// Prints s as a C string literal (escaped, cut at max bytes).
static void t_escape(FILE *f, const char *s, size_t n, size_t max) {
    fputc('"', f);
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '"') fputs("\\\"", f);
        else if (c < 32 || c == 127) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (n > max) fprintf(f, "... (%zu bytes)", n);
}

// Exact comparison; on mismatch prints the first differing byte and both strings escaped.
static bool t_same(const char *what, const char *got, size_t got_n, const char *want, size_t want_n) {
    if (got_n == want_n && memcmp(got, want, got_n) == 0) return true;
    size_t i = 0;
    while (i < got_n && i < want_n && got[i] == want[i]) i++;
    fprintf(stderr, "%s: output differs at byte %zu (got %zu bytes, want %zu)\n  got:  ", what, i, got_n, want_n);
    t_escape(stderr, got, got_n, 4000);
    fprintf(stderr, "\n  want: ");
    t_escape(stderr, want, want_n, 4000);
    fprintf(stderr, "\n  from byte %zu, got: ", i);
    t_escape(stderr, got + i, got_n - i, 80);
    fprintf(stderr, "\n              want: ");
    t_escape(stderr, want + i, want_n - i, 80);
    fputc('\n', stderr);
    return false;
}

// Spans are in order, in bounds, non-empty and do not touch (adjacent ranges are merged).
static bool t_spans_ok(const buf_t *out, const chat_spans *sp) {
    size_t end = 0;
    for (size_t i = 0; i < sp->n; i++) {
        if (sp->v[i].n == 0 || sp->v[i].off > out->len || out->len - sp->v[i].off < sp->v[i].n) return false;
        if (i && sp->v[i].off <= end) return false;
        end = sp->v[i].off + sp->v[i].n;
    }
    return true;
}

// True when the n bytes at p occur in s.
static bool t_contains(str_t s, const char *p, size_t n) {
    for (size_t i = 0; n <= s.n && i <= s.n - n; i++)
        if (memcmp(s.p + i, p, n) == 0) return true;
    return false;
}

// Applies and compares with want (NUL-terminated); checks the span invariants on the way.
static void t_expect(const char *what, chat_format f, const chat_msg *m, size_t n, bool gen, const char *want) {
    buf_t out = {0};
    chat_spans sp = {0};
    psv_error err = {0};
    psv_status st = chat_apply(f, m, n, gen, &out, &sp, &err);
    CHECKF(st == PSV_OK, "%s: %s", what, err.message);
    if (st == PSV_OK) {
        CHECK(t_same(what, out.data, out.len, want, strlen(want)));
        CHECKF(t_spans_ok(&out, &sp), "%s: bad spans", what);
    }
    chat_spans_free(&sp);
    buf_free(&out);
}

// The conversation of the conformance file, for the embedded cases.
static const chat_msg *t_conv(size_t *n) {
    static chat_msg m[6];
    m[0] = chat_msg_c("system", "You are a helpful assistant");
    m[1] = chat_msg_c("user", "Hello");
    m[2] = chat_msg_c("assistant", "Hi there");
    m[3] = chat_msg_c("user", "Who are you");
    m[4] = chat_msg_c("assistant", "   I am an assistant   ");
    m[5] = chat_msg_c("user", "Another question");
    *n = 6;
    return m;
}

// Real models' chat templates (tokenizer_config.json "chat_template", as stored in GGUF
// tokenizer.chat_template) and the format each must be recognised as.
static const struct {
    const char *model;
    chat_format want;
    const char *src;
} t_real[] = {
    {"Phi-3.5-mini-instruct", CHAT_PHI3,
        "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{"
        "'<|system|>\n"
        "' + message['content'] + '<|end|>\n"
        "'}}{% elif message['role'] == 'user' %}{{'<|user|>\n"
        "' + message['content'] + '<|end|>\n"
        "'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n"
        "' + message['content'] + '<|end|>\n"
        "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n"
        "' }}{% else %}{{ eos_token }}{% endif %}"},
    {"Phi-4-mini-instruct", CHAT_PHI4_MINI,
        "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
        "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|"
        "tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role']"
        " + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_pro"
        "mpt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"},
    {"Llama-3-8B-Instruct", CHAT_LLAMA3,
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|st"
        "art_header_id|>' + message['role'] + '<|end_header_id|>\n"
        "\n"
        "'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bo"
        "s_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|"
        "end_header_id|>\n"
        "\n"
        "' }}"},
    {"Llama-3.2-3B-Instruct", CHAT_LLAMA3,
        "{{- bos_token }}\n"
        "{%- if custom_tools is defined %}\n"
        "    {%- set tools = custom_tools %}\n"
        "{%- endif %}\n"
        "{%- if not tools_in_user_message is defined %}\n"
        "    {%- set tools_in_user_message = true %}\n"
        "{%- endif %}\n"
        "{%- if not date_string is defined %}\n"
        "    {%- if strftime_now is defined %}\n"
        "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
        "    {%- else %}\n"
        "        {%- set date_string = \"26 Jul 2024\" %}\n"
        "    {%- endif %}\n"
        "{%- endif %}\n"
        "{%- if not tools is defined %}\n"
        "    {%- set tools = none %}\n"
        "{%- endif %}\n"
        "\n"
        "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content']|trim %}\n"
        "    {%- set messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set system_message = \"\" %}\n"
        "{%- endif %}\n"
        "\n"
        "{#- System message #}\n"
        "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
        "{%- if tools is not none %}\n"
        "    {{- \"Environment: ipython\\n\" }}\n"
        "{%- endif %}\n"
        "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
        "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
        "{%- if tools is not none and not tools_in_user_message %}\n"
        "    {{- \"You have access to the following functions. To call a function, please respond w"
        "ith JSON for a function call.\" }}\n"
        "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of arg"
        "ument name and its value}.' }}\n"
        "    {{- \"Do not use variables.\\n\\n\" }}\n"
        "    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) }}\n"
        "        {{- \"\\n\\n\" }}\n"
        "    {%- endfor %}\n"
        "{%- endif %}\n"
        "{{- system_message }}\n"
        "{{- \"<|eot_id|>\" }}\n"
        "\n"
        "{#- Custom tools are passed in a user message with some extra guidance #}\n"
        "{%- if tools_in_user_message and not tools is none %}\n"
        "    {#- Extract the first user message so we can plug it in here #}\n"
        "    {%- if messages | length != 0 %}\n"
        "        {%- set first_user_message = messages[0]['content']|trim %}\n"
        "        {%- set messages = messages[1:] %}\n"
        "    {%- else %}\n"
        "        {{- raise_exception(\"Cannot put tools in the first user message when there's no f"
        "irst user message!\") }}\n"
        "{%- endif %}\n"
        "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
        "    {{- \"Given the following functions, please respond with a JSON for a function call \""
        " }}\n"
        "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
        "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of arg"
        "ument name and its value}.' }}\n"
        "    {{- \"Do not use variables.\\n\\n\" }}\n"
        "    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) }}\n"
        "        {{- \"\\n\\n\" }}\n"
        "    {%- endfor %}\n"
        "    {{- first_user_message + \"<|eot_id|>\"}}\n"
        "{%- endif %}\n"
        "\n"
        "{%- for message in messages %}\n"
        "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in mes"
        "sage) %}\n"
        "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['"
        "content'] | trim + '<|eot_id|>' }}\n"
        "    {%- elif 'tool_calls' in message %}\n"
        "        {%- if not message.tool_calls|length == 1 %}\n"
        "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }"
        "}\n"
        "        {%- endif %}\n"
        "        {%- set tool_call = message.tool_calls[0].function %}\n"
        "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
        "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
        "        {{- '\"parameters\": ' }}\n"
        "        {{- tool_call.arguments | tojson }}\n"
        "        {{- \"}\" }}\n"
        "        {{- \"<|eot_id|>\" }}\n"
        "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
        "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
        "        {%- if message.content is mapping or message.content is iterable %}\n"
        "            {{- message.content | tojson }}\n"
        "        {%- else %}\n"
        "            {{- message.content }}\n"
        "        {%- endif %}\n"
        "        {{- \"<|eot_id|>\" }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"},
    {"Qwen2.5-Instruct", CHAT_CHATML,
        "{%- if tools %}\n"
        "    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- messages[0]['content'] }}\n"
        "    {%- else %}\n"
        "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
        "    {%- endif %}\n"
        "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user qu"
        "ery.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<to"
        "ols>\" }}\n"
        "    {%- for tool in tools %}\n"
        "        {{- \"\\n\" }}\n"
        "        {{- tool | tojson }}\n"
        "    {%- endfor %}\n"
        "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name"
        " and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <fu"
        "nction-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
        "{%- else %}\n"
        "    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpfu"
        "l assistant.<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) o"
        "r (message.role == \"assistant\" and not message.tool_calls) %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'"
        " }}\n"
        "    {%- elif message.role == \"assistant\" %}\n"
        "        {{- '<|im_start|>' + message.role }}\n"
        "        {%- if message.content %}\n"
        "            {{- '\\n' + message.content }}\n"
        "        {%- endif %}\n"
        "        {%- for tool_call in message.tool_calls %}\n"
        "            {%- if tool_call.function is defined %}\n"
        "                {%- set tool_call = tool_call.function %}\n"
        "            {%- endif %}\n"
        "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
        "            {{- tool_call.name }}\n"
        "            {{- '\", \"arguments\": ' }}\n"
        "            {{- tool_call.arguments | tojson }}\n"
        "            {{- '}\\n</tool_call>' }}\n"
        "        {%- endfor %}\n"
        "        {{- '<|im_end|>\\n' }}\n"
        "    {%- elif message.role == \"tool\" %}\n"
        "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
        "            {{- '<|im_start|>user' }}\n"
        "        {%- endif %}\n"
        "        {{- '\\n<tool_response>\\n' }}\n"
        "        {{- message.content }}\n"
        "        {{- '\\n</tool_response>' }}\n"
        "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
        "            {{- '<|im_end|>\\n' }}\n"
        "        {%- endif %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"},
    {"Qwen3-0.6B", CHAT_QWEN3,
        "{%- if tools %}\n"
        "    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if messages[0].role == 'system' %}\n"
        "        {{- messages[0].content + '\\n\\n' }}\n"
        "    {%- endif %}\n"
        "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\"
        "n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\""
        " }}\n"
        "    {%- for tool in tools %}\n"
        "        {{- \"\\n\" }}\n"
        "        {{- tool | tojson }}\n"
        "    {%- endfor %}\n"
        "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name"
        " and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <fu"
        "nction-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
        "{%- else %}\n"
        "    {%- if messages[0].role == 'system' %}\n"
        "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}\n"
        "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
        "{%- for message in messages[::-1] %}\n"
        "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
        "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startsw"
        "ith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
        "        {%- set ns.multi_step_tool = false %}\n"
        "        {%- set ns.last_query_index = index %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- for message in messages %}\n"
        "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %"
        "}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'"
        " }}\n"
        "    {%- elif message.role == \"assistant\" %}\n"
        "        {%- set content = message.content %}\n"
        "        {%- set reasoning_content = '' %}\n"
        "        {%- if message.reasoning_content is defined and message.reasoning_content is not n"
        "one %}\n"
        "            {%- set reasoning_content = message.reasoning_content %}\n"
        "        {%- else %}\n"
        "            {%- if '</think>' in message.content %}\n"
        "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
        "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\"
        "n').split('<think>')[-1].lstrip('\\n') %}\n"
        "            {%- endif %}\n"
        "        {%- endif %}\n"
        "        {%- if loop.index0 > ns.last_query_index %}\n"
        "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
        "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.st"
        "rip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
        "            {%- else %}\n"
        "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
        "            {%- endif %}\n"
        "        {%- else %}\n"
        "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
        "        {%- endif %}\n"
        "        {%- if message.tool_calls %}\n"
        "            {%- for tool_call in message.tool_calls %}\n"
        "                {%- if (loop.first and content) or (not loop.first) %}\n"
        "                    {{- '\\n' }}\n"
        "                {%- endif %}\n"
        "                {%- if tool_call.function %}\n"
        "                    {%- set tool_call = tool_call.function %}\n"
        "                {%- endif %}\n"
        "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
        "                {{- tool_call.name }}\n"
        "                {{- '\", \"arguments\": ' }}\n"
        "                {%- if tool_call.arguments is string %}\n"
        "                    {{- tool_call.arguments }}\n"
        "                {%- else %}\n"
        "                    {{- tool_call.arguments | tojson }}\n"
        "                {%- endif %}\n"
        "                {{- '}\\n</tool_call>' }}\n"
        "            {%- endfor %}\n"
        "        {%- endif %}\n"
        "        {{- '<|im_end|>\\n' }}\n"
        "    {%- elif message.role == \"tool\" %}\n"
        "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
        "            {{- '<|im_start|>user' }}\n"
        "        {%- endif %}\n"
        "        {{- '\\n<tool_response>\\n' }}\n"
        "        {{- message.content }}\n"
        "        {{- '\\n</tool_response>' }}\n"
        "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
        "            {{- '<|im_end|>\\n' }}\n"
        "        {%- endif %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
        "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}"},
    {"Mistral-7B-Instruct-v0.2", CHAT_LLAMA2,
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.ind"
        "ex0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/"
        "assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['con"
        "tent'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos"
        "_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% "
        "endif %}{% endfor %}"},
    {"Mistral-Nemo-Instruct-2407", CHAT_MISTRAL_V3_TEKKEN,
        "{%- if messages[0][\"role\"] == \"system\" %}\n"
        "    {%- set system_message = messages[0][\"content\"] %}\n"
        "    {%- set loop_messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set loop_messages = messages %}\n"
        "{%- endif %}\n"
        "{%- if not tools is defined %}\n"
        "    {%- set tools = none %}\n"
        "{%- endif %}\n"
        "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list"
        " %}\n"
        "\n"
        "{#- This block checks for alternating user/assistant messages, skipping tool calling messa"
        "ges #}\n"
        "{%- set ns = namespace() %}\n"
        "{%- set ns.index = 0 %}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.t"
        "ool_calls is defined and message.tool_calls is not none)) %}\n"
        "        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n"
        "            {{- raise_exception(\"After the optional system message, conversation roles mu"
        "st alternate user/assistant/user/assistant/...\") }}\n"
        "        {%- endif %}\n"
        "        {%- set ns.index = ns.index + 1 %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "\n"
        "{{- bos_token }}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if message[\"role\"] == \"user\" %}\n"
        "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
        "            {{- \"[AVAILABLE_TOOLS][\" }}\n"
        "            {%- for tool in tools %}\n"
        "                {%- set tool = tool.function %}\n"
        "                {{- '{\"type\": \"function\", \"function\": {' }}\n"
        "                {%- for key, val in tool.items() if key != \"return\" %}\n"
        "                    {%- if val is string %}\n"
        "                        {{- '\"' + key + '\": \"' + val + '\"' }}\n"
        "                    {%- else %}\n"
        "                        {{- '\"' + key + '\": ' + val|tojson }}\n"
        "                    {%- endif %}\n"
        "                    {%- if not loop.last %}\n"
        "                        {{- \", \" }}\n"
        "                    {%- endif %}\n"
        "                {%- endfor %}\n"
        "                {{- \"}}\" }}\n"
        "                {%- if not loop.last %}\n"
        "                    {{- \", \" }}\n"
        "                {%- else %}\n"
        "                    {{- \"]\" }}\n"
        "                {%- endif %}\n"
        "            {%- endfor %}\n"
        "            {{- \"[/AVAILABLE_TOOLS]\" }}\n"
        "            {%- endif %}\n"
        "        {%- if loop.last and system_message is defined %}\n"
        "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST"
        "]\" }}\n"
        "        {%- else %}\n"
        "            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n"
        "        {%- endif %}\n"
        "    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n"
        "        {{- \"[TOOL_CALLS][\" }}\n"
        "        {%- for tool_call in message.tool_calls %}\n"
        "            {%- set out = tool_call.function|tojson %}\n"
        "            {{- out[:-1] }}\n"
        "            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n"
        "                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with le"
        "ngth 9!\") }}\n"
        "            {%- endif %}\n"
        "            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n"
        "            {%- if not loop.last %}\n"
        "                {{- \", \" }}\n"
        "            {%- else %}\n"
        "                {{- \"]\" + eos_token }}\n"
        "            {%- endif %}\n"
        "        {%- endfor %}\n"
        "    {%- elif message[\"role\"] == \"assistant\" %}\n"
        "        {{- message[\"content\"] + eos_token}}\n"
        "    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n"
        "        {%- if message.content is defined and message.content.content is defined %}\n"
        "            {%- set content = message.content.content %}\n"
        "        {%- else %}\n"
        "            {%- set content = message.content %}\n"
        "        {%- endif %}\n"
        "        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n"
        "        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n"
        "            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length"
        " 9!\") }}\n"
        "        {%- endif %}\n"
        "        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n"
        "    {%- else %}\n"
        "        {{- raise_exception(\"Only user and assistant roles are supported, with the except"
        "ion of an initial optional system message!\") }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"},
    {"Mistral-Large-Instruct-2411", CHAT_MISTRAL_V7,
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] '"
        " + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROM"
        "PT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %"
        "}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system"
        " and assistant roles are supported!') }}{% endif %}{% endfor %}"},
    {"gemma-2-2b-it", CHAT_GEMMA,
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not"
        " supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') !"
        "= (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assi"
        "stant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set ro"
        "le = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' +"
        " role + '\n"
        "' + message['content'] | trim + '<end_of_turn>\n"
        "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
        "'}}{% endif %}"},
};

static void test_names(void) {
    for (int f = 0; f < CHAT_FORMAT_COUNT; f++) {
        chat_format g;
        const char *name = chat_format_name((chat_format)f);
        CHECKF(chat_format_by_name(name, &g) && g == (chat_format)f, "name %s", name);
        bool ok = false;
        const char *warn = "unset";
        CHECKF(chat_detect(name, strlen(name), &ok, &warn) == (chat_format)f && ok && !warn, "detect name %s", name);
    }
    chat_format g = CHAT_LLAMA3;
    CHECK(!chat_format_by_name("nosuch", &g) && g == CHAT_LLAMA3);
    CHECK(!chat_format_by_name("", &g));
    CHECK(!chat_format_by_name(NULL, &g));
    CHECK(!chat_format_by_name("chatml ", &g));
    CHECK(strcmp(chat_format_name(CHAT_FORMAT_COUNT), "unknown") == 0);
    buf_t b = {0};
    chat_format_names(&b);
    CHECK(b.data && strstr(b.data, "chatml, qwen3, llama2") && strstr(b.data, "megrez"));
    buf_free(&b);
}

// Each real template is recognised as its format, and the 6-message conversation laid out in
// it. (Where a format differs from the model's Jinja, section 10's comment says how and why.)
static void test_real_templates(void) {
    for (size_t i = 0; i < PSV_ARRAY_LEN(t_real); i++) {
        bool ok = false;
        const char *warn = "unset";
        chat_format f = chat_detect(t_real[i].src, strlen(t_real[i].src), &ok, &warn);
        CHECKF(ok && !warn && f == t_real[i].want, "%s: recognised as %s (%s), want %s", t_real[i].model,
               chat_format_name(f), ok ? "recognised" : "fallback", chat_format_name(t_real[i].want));
    }
    // Detection must not depend on how newlines are spelled in the source: a real newline inside
    // the string literal ('<|user|>' + '\n' as stored by HF's JSON) or the escape.
    const char *phi3_escaped = "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + "
                               "'<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
    CHECK(chat_detect(phi3_escaped, strlen(phi3_escaped), NULL, NULL) == CHAT_PHI3);
    // The same template rendered without newlines is Phi-4-mini's layout.
    const char *no_nl = "{% for message in messages %}{{'<|' + message['role'] + '|>' + message['content'] + "
                        "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}\n{% endif %}";
    CHECK(chat_detect(no_nl, strlen(no_nl), NULL, NULL) == CHAT_PHI4_MINI);

    // Phi-4-mini: no newline after the role tag (unlike Phi-3).
    size_t n;
    const chat_msg *m = t_conv(&n);
    t_expect("phi4-mini", CHAT_PHI4_MINI, m, n, true,
             "<|system|>You are a helpful assistant<|end|><|user|>Hello<|end|><|assistant|>Hi there<|end|><|user|>Who are you"
             "<|end|><|assistant|>   I am an assistant   <|end|><|user|>Another question<|end|><|assistant|>");
}

static void test_fallback(void) {
    bool ok = true;
    const char *warn = NULL;
    const char *src = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    CHECK(chat_detect(src, strlen(src), &ok, &warn) == CHAT_CHATML);
    CHECK(!ok && warn && strstr(warn, "not recognised") && strstr(warn, "chatml"));
    ok = true;
    warn = NULL;
    CHECK(chat_detect(NULL, 0, &ok, &warn) == CHAT_CHATML && !ok && warn && strstr(warn, "chatml"));
    CHECK(chat_detect("", 0, NULL, NULL) == CHAT_CHATML);
    // A length, not NUL termination, bounds the source: "chatml" is found only within n bytes.
    CHECK(chat_detect("llama3xyz", 6, &ok, NULL) == CHAT_LLAMA3 && ok);
    CHECK(chat_detect("<|im_start|>", 5, &ok, NULL) == CHAT_CHATML && !ok);
}

// Cases that run without ../shared.
static void test_embedded(void) {
    size_t n;
    const chat_msg *m = t_conv(&n);
    t_expect("chatml multi-turn with system", CHAT_CHATML, m, n, true,
             "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
             "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
             "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
             "<|im_start|>assistant\n");
    t_expect("llama3 multi-turn (content trimmed)", CHAT_LLAMA3, m, n, true,
             "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
             "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    t_expect("llama2-sys", CHAT_LLAMA2_SYS, m, n, true,
             "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
             "   I am an assistant   </s>[INST] Another question [/INST]");
    t_expect("mistral-v3", CHAT_MISTRAL_V3, m, n, true,
             "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
             "[INST] Another question[/INST]");

    chat_msg one[] = {chat_msg_c("user", "Hello")};
    t_expect("chatml, no generation prompt", CHAT_CHATML, one, 1, false, "<|im_start|>user\nHello<|im_end|>\n");
    t_expect("phi3, generation prompt", CHAT_PHI3, one, 1, true, "<|user|>\nHello<|end|>\n<|assistant|>\n");
    t_expect("phi3, no generation prompt", CHAT_PHI3, one, 1, false, "<|user|>\nHello<|end|>\n");
    t_expect("gemma, no generation prompt", CHAT_GEMMA, one, 1, false, "<start_of_turn>user\nHello<end_of_turn>\n");
    // Formats whose user turn ends with the cue are the same either way.
    t_expect("llama2, no generation prompt", CHAT_LLAMA2, one, 1, false, "[INST] Hello [/INST]");
    t_expect("mistral-v7, no generation prompt", CHAT_MISTRAL_V7, one, 1, false, "[INST] Hello[/INST]");
    t_expect("empty conversation", CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");
    t_expect("empty conversation, no prompt", CHAT_CHATML, NULL, 0, false, "");
    buf_t empty = {0};
    CHECK(chat_apply(CHAT_CHATML, NULL, 0, false, &empty, NULL, NULL) == PSV_OK && empty.data && !empty.data[0]);
    buf_free(&empty);

    // A trailing assistant message (a prefill to continue): written as a complete turn.
    chat_msg pre[] = {chat_msg_c("system", "S"), chat_msg_c("user", "Hello"), chat_msg_c("assistant", "Partial")};
    t_expect("chatml, trailing assistant", CHAT_CHATML, pre, 3, false,
             "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nPartial<|im_end|>\n");
    t_expect("llama3, trailing assistant + prompt", CHAT_LLAMA3, pre + 1, 2, true,
             "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
             "Partial<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    t_expect("mistral-v1, trailing assistant", CHAT_MISTRAL_V1, pre, 3, false, " [INST] S\n\nHello [/INST] Partial</s>");

    // Gemma folds system messages (trimmed, joined) into the next user turn.
    chat_msg g[] = {chat_msg_c("system", "A "), chat_msg_c("system", " B"), chat_msg_c("user", "Q"),
                    chat_msg_c("assistant", "R"), chat_msg_c("system", "S"), chat_msg_c("user", "T")};
    t_expect("gemma, system folding", CHAT_GEMMA, g, 6, true,
             "<start_of_turn>user\nAB\n\nQ<end_of_turn>\n<start_of_turn>model\nR<end_of_turn>\n"
             "<start_of_turn>user\nS\n\nT<end_of_turn>\n<start_of_turn>model\n");
    chat_msg gs[] = {chat_msg_c("system", "  "), chat_msg_c("user", "Q")};
    t_expect("gemma, blank system", CHAT_GEMMA, gs, 2, true, "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n");
    chat_msg os[] = {chat_msg_c("system", "S"), chat_msg_c("user", "Q"), chat_msg_c("assistant", "A")};
    t_expect("orion", CHAT_ORION, os, 3, true, "Human: S\n\nQ\n\nAssistant: </s>A</s>");
    t_expect("gigachat without system", CHAT_GIGACHAT, one, 1, true,
             "<s>user<|role_sep|>Hello<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>");

    // Pass-through roles in formats that write the role name.
    chat_msg tool[] = {chat_msg_c("tool", "42")};
    t_expect("chatml, tool role", CHAT_CHATML, tool, 1, false, "<|im_start|>tool\n42<|im_end|>\n");
    t_expect("exaone4, tool role", CHAT_EXAONE4, tool, 1, false, "[|tool|]42[|endofturn|]\n");

    // Content may hold NUL bytes: lengths, not terminators, delimit it.
    chat_msg nul[] = {{str_c("user"), {"a\0b", 3}}};
    buf_t out = {0};
    CHECK(chat_apply(CHAT_CHATML, nul, 1, false, &out, NULL, NULL) == PSV_OK);
    CHECK(out.len == 31 && memcmp(out.data, "<|im_start|>user\na\0b<|im_end|>\n", 31) == 0);
    buf_free(&out);
}

// Qwen3's thinking rules, checked against its template rendered by Jinja2.
static void test_qwen3(void) {
    chat_msg a[] = {chat_msg_c("system", "S"), chat_msg_c("user", "Q1"),
                    chat_msg_c("assistant", "<think>\nr1\n</think>\n\nA1"), chat_msg_c("user", "Q2")};
    t_expect("qwen3: reasoning dropped from history", CHAT_QWEN3, a, 4, true,
             "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
             "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
    chat_msg b[] = {chat_msg_c("user", "Q"), chat_msg_c("assistant", "A")};
    t_expect("qwen3: final answer gets a think block", CHAT_QWEN3, b, 2, false,
             "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
    chat_msg c[] = {chat_msg_c("user", "Q"), chat_msg_c("assistant", "call"), chat_msg_c("tool", "r1"),
                    chat_msg_c("tool", "r2")};
    t_expect("qwen3: tool results share a user turn", CHAT_QWEN3, c, 4, true,
             "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\ncall<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n"
             "</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    chat_msg d[] = {chat_msg_c("user", "Q"), chat_msg_c("assistant", "<think>why</think>A"), chat_msg_c("tool", "r")};
    t_expect("qwen3: reasoning kept after the last query", CHAT_QWEN3, d, 3, true,
             "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n"
             "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    chat_msg e[] = {chat_msg_c("user", "Q"),
                    chat_msg_c("assistant", "\n\nx<think>\n\nr <think> s\n\n</think>\n\nmid</think>\n\nA\n")};
    t_expect("qwen3: nested markers", CHAT_QWEN3, e, 2, false,
             "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n s\n</think>\n\nA\n<|im_end|>\n");
    chat_msg f[] = {chat_msg_c("user", "<tool_response>x</tool_response>"), chat_msg_c("assistant", "<think>t</think>B")};
    t_expect("qwen3: wrapped tool response is not a query", CHAT_QWEN3, f, 2, true,
             "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n"
             "<|im_start|>assistant\n");
}

static void test_errors(void) {
    buf_t out = {0};
    buf_puts(&out, "X");
    chat_spans sp = {0};
    psv_error err = {0};
    chat_msg tool[] = {chat_msg_c("user", "Q"), chat_msg_c("tool", "42")};
    CHECK(chat_apply(CHAT_LLAMA2, tool, 2, true, &out, &sp, &err) == PSV_ERR_INVALID);
    CHECKF(strstr(err.message, "message 1") && strstr(err.message, "'tool'") && strstr(err.message, "llama2"), "%s",
           err.message);
    CHECK(out.len == 1 && strcmp(out.data, "X") == 0 && sp.n == 0); // left as it was
    err_clear(&err);
    chat_msg norole[] = {{{NULL, 0}, str_c("hi")}};
    CHECK(chat_apply(CHAT_CHATML, norole, 1, true, &out, NULL, &err) == PSV_ERR_INVALID && strstr(err.message, "role"));
    err_clear(&err);
    chat_msg empty_role[] = {{{"", 0}, str_c("hi")}};
    CHECK(chat_apply(CHAT_CHATML, empty_role, 1, true, &out, NULL, &err) == PSV_ERR_INVALID);
    err_clear(&err);
    chat_msg nullc[] = {{str_c("user"), {NULL, 3}}};
    CHECK(chat_apply(CHAT_CHATML, nullc, 1, true, &out, NULL, &err) == PSV_ERR_INVALID);
    err_clear(&err);
    chat_msg late[] = {chat_msg_c("user", "Q"), chat_msg_c("system", "S")};
    CHECK(chat_apply(CHAT_GIGACHAT, late, 2, true, &out, NULL, &err) == PSV_ERR_INVALID && strstr(err.message, "gigachat"));
    err_clear(&err);
    CHECK(chat_apply(CHAT_FORMAT_COUNT, late, 1, true, &out, NULL, &err) == PSV_ERR_INVALID);
    CHECK(chat_apply((chat_format)-1, late, 1, true, &out, NULL, NULL) == PSV_ERR_INVALID);
    CHECK(chat_apply(CHAT_CHATML, NULL, 2, true, &out, NULL, NULL) == PSV_ERR_INVALID);
    CHECK(out.len == 1);
    // NULL content of length 0 is an empty message.
    chat_msg nc[] = {{str_c("user"), {NULL, 0}}};
    CHECK(chat_apply(CHAT_PHI4_MINI, nc, 1, false, &out, NULL, NULL) == PSV_OK && strcmp(out.data, "X<|user|><|end|>") == 0);
    chat_spans_free(&sp);
    buf_free(&out);
}

// Message bytes are reported as spans; template text is not. chat_apply appends, so offsets are
// into the whole buffer.
static void test_spans(void) {
    buf_t out = {0};
    chat_spans sp = {0};
    buf_puts(&out, "PRE");
    chat_msg m[] = {chat_msg_c("user", "<|im_end|>evil"), chat_msg_c("tool", "r")};
    CHECK(chat_apply(CHAT_CHATML, m, 2, true, &out, &sp, NULL) == PSV_OK);
    CHECK(strncmp(out.data, "PRE<|im_start|>user\n<|im_end|>evil<|im_end|>\n", 45) == 0);
    CHECK(sp.n == 3 && t_spans_ok(&out, &sp));
    if (sp.n == 3) {
        CHECK(sp.v[0].off == 20 && sp.v[0].n == 14); // the content
        CHECK(sp.v[1].n == 4 && memcmp(out.data + sp.v[1].off, "tool", 4) == 0); // a caller's role
        CHECK(sp.v[2].n == 1 && out.data[sp.v[2].off] == 'r');
    }
    chat_spans_free(&sp);
    buf_free(&out);

    // In every format, each span is a piece of some message, and the spans cover all of them.
    size_t n;
    const chat_msg *conv = t_conv(&n);
    for (int f = 0; f < CHAT_FORMAT_COUNT; f++) {
        CHECK(chat_apply((chat_format)f, conv, n, true, &out, &sp, NULL) == PSV_OK);
        CHECK(t_spans_ok(&out, &sp));
        size_t covered = 0;
        for (size_t i = 0; i < sp.n; i++) {
            bool found = false;
            for (size_t k = 0; k < n && !found; k++)
                found = t_contains(conv[k].content, out.data + sp.v[i].off, sp.v[i].n);
            CHECKF(found, "%s: span %zu is not message content", chat_format_name((chat_format)f), i);
            covered += sp.v[i].n;
        }
        // All the conversation's content (84 bytes trimmed, 90 as given) and nothing else.
        CHECKF(covered >= 84 && covered <= 90, "%s: %zu bytes in spans", chat_format_name((chat_format)f), covered);
        chat_spans_free(&sp);
        buf_free(&out);
    }
}

static void test_bos(void) {
    str_t bos = str_c("<s>");
    buf_t out = {0};
    chat_spans sp = {0};
    chat_msg one[] = {chat_msg_c("user", "Hello")};
    CHECK(chat_apply(CHAT_GIGACHAT, one, 1, true, &out, &sp, NULL) == PSV_OK);
    CHECK(chat_bos_prefix(out.data, out.len, &sp, bos) == 3);
    CHECK(chat_bos_prefix(out.data, out.len, &sp, str_c("<|begin_of_text|>")) == 0);
    CHECK(chat_bos_prefix(out.data, out.len, &sp, (str_t){NULL, 0}) == 0);
    chat_spans_free(&sp);
    buf_free(&out);
    // Message bytes that look like BOS are content: never stripped.
    chat_msg v[] = {chat_msg_c("system", "<s>x"), chat_msg_c("user", "q")};
    CHECK(chat_apply(CHAT_VICUNA, v, 2, true, &out, &sp, NULL) == PSV_OK);
    CHECK(strncmp(out.data, "<s>x", 4) == 0 && chat_bos_prefix(out.data, out.len, &sp, bos) == 0);
    chat_spans_free(&sp);
    buf_free(&out);
    // No other format starts with the BOS text of common vocabularies.
    const char *bos_texts[] = {"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>", "<\357\275\234begin\342\226\201of\342\226\201sentence\357\275\234>"};
    size_t n;
    const chat_msg *conv = t_conv(&n);
    for (int f = 0; f < CHAT_FORMAT_COUNT; f++) {
        CHECK(chat_apply((chat_format)f, conv, n, true, &out, &sp, NULL) == PSV_OK);
        for (size_t k = 0; k < PSV_ARRAY_LEN(bos_texts); k++) {
            size_t cut = chat_bos_prefix(out.data, out.len, &sp, str_c(bos_texts[k]));
            CHECKF(cut == 0 || (f == CHAT_GIGACHAT && k == 0), "%s starts with %s", chat_format_name((chat_format)f), bos_texts[k]);
        }
        chat_spans_free(&sp);
        buf_free(&out);
    }
}

// All cases of ../shared/conformance/chat/templates.json, exactly.
static void test_conformance(void) {
    const char *path = t_shared_path("conformance/chat/templates.json");
    if (!path) {
        SKIP("chat conformance: ../shared is absent");
        return;
    }
    char *text = NULL;
    size_t len = 0;
    json_doc *doc = NULL;
    psv_error err = {0};
    CHECKF(plat_read_file(path, &text, &len, &err) == PSV_OK, "%s", err.message);
    if (!text) return;
    CHECKF(json_parse(text, len, &doc, &err) == PSV_OK, "%s", err.message);
    const json_value *cases = json_get(json_root(doc), "cases");
    size_t n_cases = json_len(cases), n_ok = 0, n_jinja = 0;
    CHECKF(n_cases == 58, "%zu cases, expected 58", n_cases);
    for (size_t i = 0; i < n_cases; i++) {
        const json_value *c = json_at(cases, i), *msgs = json_get(c, "messages");
        const json_value *tmpl = json_get(c, "template"), *want = json_get(c, "expected");
        const char *name = json_str(json_get(c, "name"));
        char what[160];
        snprintf(what, sizeof what, "conformance case %zu (%s)", i, name ? name : "?");
        if (!tmpl || tmpl->kind != JSON_STRING || !want || want->kind != JSON_STRING || json_len(msgs) == 0) {
            CHECKF(false, "%s: malformed case", what);
            continue;
        }
        chat_format g;
        bool is_name = chat_format_by_name_n(tmpl->u.s.p, tmpl->u.s.n, &g), ok = false;
        chat_format f = chat_detect(tmpl->u.s.p, tmpl->u.s.n, &ok, NULL);
        if (!is_name) n_jinja++;
        CHECKF(ok, "%s: template not recognised", what);
        size_t n = json_len(msgs);
        chat_msg *m = calloc(n, sizeof *m);
        for (size_t k = 0; m && k < n; k++) {
            const json_value *r = json_get(json_at(msgs, k), "role"), *t = json_get(json_at(msgs, k), "content");
            if (r && r->kind == JSON_STRING) m[k].role = (str_t){r->u.s.p, r->u.s.n};
            if (t && t->kind == JSON_STRING) m[k].content = (str_t){t->u.s.p, t->u.s.n};
        }
        buf_t out = {0};
        chat_spans sp = {0};
        err_clear(&err);
        psv_status st = m ? chat_apply(f, m, n, true, &out, &sp, &err) : PSV_ERR_NOMEM;
        CHECKF(st == PSV_OK, "%s: %s", what, err.message);
        if (st == PSV_OK) {
            bool same = t_same(what, out.data, out.len, want->u.s.p, want->u.s.n);
            CHECK(same);
            CHECK(t_spans_ok(&out, &sp));
            n_ok += same;
        }
        chat_spans_free(&sp);
        buf_free(&out);
        free(m);
    }
    printf("chat conformance: %zu/%zu cases exact (%zu given as Jinja source)\n", n_ok, n_cases, n_jinja);
    json_doc_free(doc);
    free(text);
}

// The chat prompts of ../shared/reference: each model's own tokenizer.chat_template (or the
// chatml fallback when it has none) applied to the system message and the case's text, as
// text and as token ids.
static void test_reference_prompts(void) {
    static const char *models[] = {"llama-spm-q40", "llama-spm-q4km", "phi2-f16", "phi3-q5km", "phi4mini-q4km", "qwen2-q3km"};
    if (!t_shared_path("reference")) {
        SKIP("reference chat prompts: ../shared is absent");
        return;
    }
    size_t n_checked = 0;
    for (size_t i = 0; i < PSV_ARRAY_LEN(models); i++) {
        char rel[256];
        psv_error err = {0};
        char *text = NULL;
        size_t len = 0;
        json_doc *doc = NULL;
        gguf_file *g = NULL;
        snprintf(rel, sizeof rel, "reference/expected/%s.json", models[i]);
        CHECKF(plat_read_file(t_shared_path(rel), &text, &len, &err) == PSV_OK, "%s", err.message);
        CHECKF(text && json_parse(text, len, &doc, &err) == PSV_OK, "%s: %s", rel, err.message);
        snprintf(rel, sizeof rel, "reference/models/%s.gguf", models[i]);
        CHECKF(gguf_open(t_shared_path(rel), &g, &err) == PSV_OK, "%s", err.message);
        tok_vocab *v = NULL;
        CHECKF(g && tok_load(g, &v, &err) == PSV_OK, "%s: %s", rel, err.message);
        const json_value *cases = json_get(json_root(doc), "cases");
        for (size_t k = 0; g && k < json_len(cases); k++) {
            const json_value *c = json_at(cases, k), *mode = json_get(c, "mode");
            if (!mode || !json_str(mode) || strcmp(json_str(mode), "chat") != 0) continue;
            const json_value *txt = json_get(c, "text"), *prompt = json_get(c, "prompt");
            if (!txt || txt->kind != JSON_STRING || !prompt || prompt->kind != JSON_STRING) {
                CHECKF(false, "%s: chat case %zu without text/prompt", models[i], k);
                continue;
            }
            str_t src = {NULL, 0};
            gguf_get_str(g, "tokenizer.chat_template", &src);
            chat_format f = chat_detect(src.p, src.n, NULL, NULL);
            chat_msg m[] = {chat_msg_c("system", "You are a helpful assistant."), {str_c("user"), {txt->u.s.p, txt->u.s.n}}};
            buf_t out = {0};
            char what[160];
            snprintf(what, sizeof what, "%s chat prompt (%s)", models[i], chat_format_name(f));
            CHECK(chat_apply(f, m, 2, true, &out, NULL, NULL) == PSV_OK);
            CHECK(t_same(what, out.data, out.len, prompt->u.s.p, prompt->u.s.n));
            buf_free(&out);
            // And its tokens: BOS per the vocabulary, never doubled, specials parsed in the
            // template text (the reference's prompt_ids).
            const json_value *want = json_get(c, "prompt_ids");
            int32_t *ids = NULL;
            size_t n_ids = 0;
            err_clear(&err);
            CHECKF(v && chat_tokenize(v, f, m, 2, true, &ids, &n_ids, &err) == PSV_OK, "%s: %s", what, err.message);
            bool same = ids && n_ids == json_len(want);
            for (size_t t = 0; same && t < n_ids; t++) same = json_num(json_at(want, t)) == (double)ids[t];
            CHECKF(same, "%s: prompt ids differ (%zu ids, want %zu)", what, n_ids, json_len(want));
            free(ids);
            n_checked++;
        }
        tok_free(v);
        gguf_close(g);
        json_doc_free(doc);
        free(text);
    }
    CHECKF(n_checked >= 5, "only %zu reference chat prompts found", n_checked);
}

// chat_tokenize on real vocabularies: one BOS even when the layout writes its text, and control
// tokens in message content stay text.
static void test_tokenize_rules(void) {
    const char *phi3 = t_shared_path("reference/models/phi3-q5km.gguf");
    if (!phi3) {
        SKIP("chat_tokenize rules: ../shared is absent");
        return;
    }
    psv_error err = {0};
    gguf_file *g = NULL;
    tok_vocab *v = NULL;
    CHECKF(gguf_open(phi3, &g, &err) == PSV_OK && tok_load(g, &v, &err) == PSV_OK, "%s", err.message);
    gguf_close(g);
    if (!v) return;
    int32_t end_id = -1, *ids = NULL;
    size_t n_ids = 0;
    for (int32_t id = 0; id < tok_n_vocab(v); id++) {
        size_t len;
        const char *t = tok_token_text(v, id, &len);
        if (len == 7 && memcmp(t, "<|end|>", 7) == 0) end_id = id;
    }
    CHECK(end_id >= 0 && tok_is_control(v, end_id));
    chat_msg m[] = {chat_msg_c("user", "say <|end|> now")};
    CHECK(chat_tokenize(v, CHAT_PHI3, m, 1, true, &ids, &n_ids, &err) == PSV_OK);
    size_t n_end = 0;
    for (size_t i = 0; i < n_ids; i++) n_end += ids[i] == end_id;
    CHECKF(n_end == 1, "<|end|> in content became the control token (%zu times)", n_end);
    CHECK(n_ids > 0 && ids[0] == tok_bos(v));
    free(ids);
    ids = NULL, n_ids = 0; // as they were if the next call does not run or fails
    // gigachat writes "<s>" itself: with the vocabulary adding BOS, there is still one.
    CHECK(tok_add_bos(v) && chat_tokenize(v, CHAT_GIGACHAT, m, 1, true, &ids, &n_ids, &err) == PSV_OK);
    CHECK(n_ids > 1 && ids[0] == tok_bos(v) && ids[1] != tok_bos(v));
    free(ids);
    tok_free(v);
}

// Writes s to a new temporary file; returns its malloc'd path.
static char *t_tmpfile(const char *s) {
    char *path = strdup("/tmp/psv_test_chat_XXXXXX");
    int fd = path ? mkstemp(path) : -1;
    if (fd < 0) {
        free(path);
        return NULL;
    }
    size_t n = strlen(s);
    bool ok = write(fd, s, n) == (ssize_t)n;
    close(fd);
    if (!ok) {
        unlink(path);
        free(path);
        return NULL;
    }
    return path;
}

static int t_cli(int argc, const char **argv) { return cli_template(argc, (char **)argv); }

// The CLI's failures, in process (its output is checked byte for byte by tests/cli_template.sh).
static void test_cli_errors(void) {
    char *good = t_tmpfile("[{\"role\":\"user\",\"content\":\"Hi\"}]");
    char *bad_json = t_tmpfile("[{\"role\":\"user\",\"content\":\"Hi\"}");
    char *no_content = t_tmpfile("[{\"role\":\"user\"}]");
    char *num_role = t_tmpfile("[{\"role\":1,\"content\":\"x\"}]");
    char *not_array = t_tmpfile("{\"role\":\"user\",\"content\":\"Hi\"}");
    char *tool = t_tmpfile("[{\"role\":\"tool\",\"content\":\"x\"}]");
    CHECK(good && bad_json && no_content && num_role && not_array && tool);
    if (good && bad_json && no_content && num_role && not_array && tool) {
        fprintf(stderr, "(the CLI error messages below are expected)\n");
        CHECK(t_cli(1, (const char *[]){"template"}) == 2);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "-m", "x.gguf"}) == 2);
        CHECK(t_cli(3, (const char *[]){"template", "--template", "chatml"}) == 2);
        CHECK(t_cli(4, (const char *[]){"template", "--template", "chatml", "--messages"}) == 2);
        CHECK(t_cli(6, (const char *[]){"template", "--template", "chatml", "--messages", good, "--bogus"}) == 2);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "no-such-format", "--messages", good}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "--messages", bad_json}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "--messages", no_content}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "--messages", num_role}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "--messages", not_array}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "llama2", "--messages", tool}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "--template", "chatml", "--messages", "/nonexistent/m.json"}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "-m", "/nonexistent/model.gguf", "--messages", good}) == 1);
        CHECK(t_cli(5, (const char *[]){"template", "-m", good, "--messages", good}) == 1); // not a GGUF
    }
    char *files[] = {good, bad_json, no_content, num_role, not_array, tool};
    for (size_t i = 0; i < PSV_ARRAY_LEN(files); i++) {
        if (files[i]) unlink(files[i]);
        free(files[i]);
    }
}

int main(void) {
    test_names();
    test_real_templates();
    test_fallback();
    test_embedded();
    test_qwen3();
    test_errors();
    test_spans();
    test_bos();
    test_conformance();
    test_reference_prompts();
    test_tokenize_rules();
    test_cli_errors();
    return t_finish();
}
