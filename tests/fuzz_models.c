// tests/fuzz_models.c — libFuzzer harness for section 18's parsers of untrusted text: the
// Content-Range and entity-tag readers pensieve-pull applies to server headers, and the file
// names taken from URLs. Each result is checked against the parser's contract.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    uint64_t first, last, complete;
    if (models_parse_content_range(s, size, &first, &last, &complete)) {
        PSV_ASSERT(first != UINT64_MAX || last == UINT64_MAX);
        PSV_ASSERT(first == UINT64_MAX || first <= last);
        PSV_ASSERT(first == UINT64_MAX || complete == UINT64_MAX || last < complete);
        PSV_ASSERT(!(first == UINT64_MAX && complete == UINT64_MAX));
    }
    char hex[65];
    if (models_etag_digest(s, size, hex)) {
        PSV_ASSERT(strlen(hex) == 64);
        for (int i = 0; i < 64; i++) PSV_ASSERT((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'));
    }
    char *z = malloc(size + 1);
    if (!z) return 0;
    memcpy(z, data, size);
    z[size] = 0;
    char name[256];
    if (models_url_filename(z, name, sizeof name)) PSV_ASSERT(models_safe_filename(name) && !strchr(name, '/'));
    if (models_safe_filename(z)) PSV_ASSERT(!strchr(z, '/') && z[0] != '.');
    free(z);
    return 0;
}
