// tests/bench_tokenizer.c — tokenizer speed: 1 MB of generated English through the BPE
// (gpt-4o, llama-bpe pre-tokenizers) and SPM vocabularies of ../shared/conformance/tokenizer.
// A benchmark, not a test: it prints timings and asserts nothing.
//
//   cc -O2 -I. tests/bench_tokenizer.c -o bench_tokenizer -lpthread && ./bench_tokenizer
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

static uint64_t bench_rng = 0x9e3779b97f4a7c15ull;
static uint32_t bench_next(void) { // xorshift64*: fixed seed, same text every run
    bench_rng ^= bench_rng >> 12;
    bench_rng ^= bench_rng << 25;
    bench_rng ^= bench_rng >> 27;
    return (uint32_t)((bench_rng * 0x2545f4914f6cdd1dull) >> 32);
}

// About 1 MB of sentences: common words, capitalised starts, numbers, punctuation, paragraphs.
static char *bench_text(size_t target, size_t *n) {
    static const char *const words[] = {
        "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
        "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
        "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
        "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
        "language", "model", "tokenizer", "inference", "quantized", "weights", "server", "memory",
        "performance", "library", "embedding", "attention", "context", "generation", "sampling",
        "temperature", "probability", "vocabulary", "sentence", "paragraph", "beautiful",
        "mountain", "river", "history", "government", "university", "understanding", "don't",
        "it's", "we're", "they've", "I'm", "you'll", "she'd", "cannot", "environment", "résumé",
        "naïve", "café", "straightforward", "well-known", "e-mail", "co-operate",
    };
    static const char *const punct[] = {",", ",", ";", ":", " -", ""};
    static const char *const ends[] = {".", ".", ".", "?", "!", "...", "\"."};
    buf_t b = {0};
    while (b.len < target) {
        size_t nw = 4 + bench_next() % 16;
        for (size_t i = 0; i < nw; i++) {
            const char *w = words[bench_next() % PSV_ARRAY_LEN(words)];
            if (i) buf_putc(&b, ' ');
            if (bench_next() % 40 == 0) {
                buf_printf(&b, "%u", bench_next() % 100000);
                continue;
            }
            if (i == 0) {
                buf_putc(&b, (char)toupper((unsigned char)w[0]));
                buf_puts(&b, w + 1);
            } else {
                buf_puts(&b, w);
            }
            if (bench_next() % 9 == 0) buf_puts(&b, punct[bench_next() % PSV_ARRAY_LEN(punct)]);
        }
        buf_puts(&b, ends[bench_next() % PSV_ARRAY_LEN(ends)]);
        buf_puts(&b, bench_next() % 8 == 0 ? "\n\n" : " ");
    }
    *n = b.len;
    return b.data;
}

int main(int argc, char **argv) {
    const char *shared = getenv("PSV_SHARED");
    if (!shared || !*shared) shared = "../shared";
    static const char *const vocabs[] = {"gpt-2-pre-gpt-4o", "gpt-2-pre-llama-bpe", "llama-spm"};
    size_t n;
    char *text = bench_text(1u << 20, &n);
    printf("text: %zu bytes\n", n);
    for (size_t k = 0; k < PSV_ARRAY_LEN(vocabs); k++) {
        if (argc > 1 && !strstr(vocabs[k], argv[1])) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/conformance/tokenizer/ggml-vocab-%s.gguf", shared, vocabs[k]);
        psv_error err = {0};
        gguf_file *f = NULL;
        tok_vocab *v = NULL;
        double t0 = plat_now();
        if (gguf_open(path, &f, &err) != PSV_OK || tok_load(f, &v, &err) != PSV_OK) {
            printf("%s: skipped: %s\n", vocabs[k], err.message);
            gguf_close(f);
            continue;
        }
        double t_load = plat_now() - t0, best = 1e9;
        size_t n_ids = 0;
        for (int rep = 0; rep < 3; rep++) {
            int32_t *ids = NULL;
            t0 = plat_now();
            if (tok_encode(v, text, n, false, false, &ids, &n_ids, &err) != PSV_OK) {
                printf("%s: %s\n", vocabs[k], err.message);
                break;
            }
            double t = plat_now() - t0;
            if (t < best) best = t;
            free(ids);
        }
        printf("%-22s load %.3f s, encode 1 MB: %.3f s (%.1f MB/s, %zu tokens)\n", vocabs[k], t_load, best,
               (double)n / best / 1e6, n_ids);
        tok_free(v);
        gguf_close(f);
    }
    free(text);
    return 0;
}
