// tests/fuzz_chat.c — libFuzzer harness for chat-template recognition and layout.
//
// Input: one flag byte, then fields separated by NUL bytes: the template source, then
// role/content pairs. A one-byte role is a shorthand (byte % 5: system, user, assistant, tool,
// "x") so most inputs reach the layouts; longer roles are taken as given. The template is
// detected, and the messages are laid out in the detected format and in every other format,
// with and without the generation prompt (flag bit 0 picks the order). Invariants: no crash or
// sanitizer report, spans in bounds and in order, a failed call leaves the buffer untouched,
// chat_bos_prefix never exceeds the prompt.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

#define FUZZ_MAX_MSGS 64

static void fuzz_check(bool ok) {
    if (!ok) __builtin_trap();
}

static void fuzz_apply(chat_format f, const chat_msg *m, size_t n, bool gen) {
    buf_t out = {0};
    chat_spans sp = {0};
    psv_error err = {0};
    psv_status st = chat_apply(f, m, n, gen, &out, &sp, &err);
    if (st == PSV_OK) {
        fuzz_check(out.data != NULL && out.data[out.len] == 0);
        size_t end = 0;
        for (size_t i = 0; i < sp.n; i++) {
            fuzz_check(sp.v[i].n > 0 && sp.v[i].off <= out.len && out.len - sp.v[i].off >= sp.v[i].n);
            fuzz_check(i == 0 || sp.v[i].off > end);
            end = sp.v[i].off + sp.v[i].n;
        }
        fuzz_check(chat_bos_prefix(out.data, out.len, &sp, str_c("<s>")) <= out.len);
    } else {
        fuzz_check(out.len == 0 && sp.n == 0 && err.status == st && err.message[0]);
    }
    chat_spans_free(&sp);
    buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *short_roles[] = {"system", "user", "assistant", "tool", "x"};
    if (size < 1) return 0;
    bool gen_first = data[0] & 1;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    str_t fields[1 + 2 * FUZZ_MAX_MSGS];
    size_t nf = 0;
    while (nf < PSV_ARRAY_LEN(fields)) {
        const char *z = memchr(p, 0, (size_t)(end - p));
        const char *stop = z ? z : end;
        fields[nf++] = (str_t){p, (size_t)(stop - p)};
        if (!z) break;
        p = z + 1;
    }
    chat_msg m[FUZZ_MAX_MSGS];
    size_t n = 0;
    for (size_t i = 1; i + 1 < nf && n < FUZZ_MAX_MSGS; i += 2) {
        str_t role = fields[i];
        if (role.n == 1) role = str_c(short_roles[(unsigned char)role.p[0] % 5]);
        m[n++] = (chat_msg){role, fields[i + 1]};
    }
    bool ok = true;
    const char *warn = NULL;
    chat_format f = chat_detect(fields[0].p, fields[0].n, &ok, &warn);
    fuzz_check((unsigned)f < CHAT_FORMAT_COUNT && ok == (warn == NULL) && (ok || f == CHAT_CHATML));
    fuzz_apply(f, m, n, gen_first);
    for (int g = 0; g < CHAT_FORMAT_COUNT; g++) {
        fuzz_apply((chat_format)g, m, n, gen_first);
        fuzz_apply((chat_format)g, m, n, !gen_first);
    }
    return 0;
}
