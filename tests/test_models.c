// tests/test_models.c — section 18 (model files): cache-directory rules, the registry's
// consistency, the header parsers pensieve-pull relies on, sidecars, locks, models_resolve and
// the zero-config models_ensure (with a stand-in for pensieve-pull).
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

static char tmp_dir[256];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_cache_dir(void) {
    static const struct {
        const char *home_var, *xdg, *home, *want; // want NULL: an error
        psv_status st;
    } cases[] = {
        {"/ph", "/xdg", "/home/u", "/ph", PSV_OK},
        {"/ph/", "/xdg", "/home/u", "/ph", PSV_OK},
        {"", "/xdg", "/home/u", "/xdg/pensieve", PSV_OK},
        {NULL, "/xdg", "/home/u", "/xdg/pensieve", PSV_OK},
        {NULL, "relative/xdg", "/home/u", "/home/u/.cache/pensieve", PSV_OK}, // XDG: relative is invalid
        {NULL, "", "/home/u", "/home/u/.cache/pensieve", PSV_OK},
        {NULL, NULL, "/home/u", "/home/u/.cache/pensieve", PSV_OK},
        {"relative/ph", NULL, "/home/u", "relative/ph", PSV_OK}, // PENSIEVE_HOME is taken as given
        {NULL, NULL, NULL, NULL, PSV_ERR_INVALID},
        {"", "", "", NULL, PSV_ERR_INVALID},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        char out[256];
        psv_error err = {0};
        psv_status st = models_cache_dir_from(cases[i].home_var, cases[i].xdg, cases[i].home, out, sizeof out, &err);
        CHECKF(st == cases[i].st, "case %zu: status %d", i, (int)st);
        if (cases[i].want) CHECKF(st == PSV_OK && !strcmp(out, cases[i].want), "case %zu: got '%s'", i, out);
        else CHECKF(strstr(err.message, "PENSIEVE_HOME") != NULL, "case %zu: message '%s'", i, err.message);
    }
    char small[8];
    psv_error err = {0};
    CHECK(models_cache_dir_from(NULL, NULL, "/home/someone", small, sizeof small, &err) == PSV_ERR_RANGE);

    // The real environment, in the same order.
    char out[MODELS_PATH_MAX];
    setenv("PENSIEVE_HOME", "/p/h", 1);
    setenv("XDG_CACHE_HOME", "/x/c", 1);
    setenv("HOME", "/h", 1);
    CHECK(models_cache_dir(out, sizeof out, NULL) == PSV_OK && !strcmp(out, "/p/h"));
    unsetenv("PENSIEVE_HOME");
    CHECK(models_cache_dir(out, sizeof out, NULL) == PSV_OK && !strcmp(out, "/x/c/pensieve"));
    unsetenv("XDG_CACHE_HOME");
    CHECK(models_cache_dir(out, sizeof out, NULL) == PSV_OK && !strcmp(out, "/h/.cache/pensieve"));
    unsetenv("HOME");
    CHECK(models_cache_dir(out, sizeof out, NULL) == PSV_ERR_INVALID);
}

static bool all_hex_lower(const char *s, size_t n) {
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static void test_registry(void) {
    size_t n = PSV_ARRAY_LEN(models_registry);
    CHECK(n >= 8);
    static const char *const required[] = {"phi-4-mini", "phi-3.5-mini", "phi-4", "llama-3.2-1b", "llama-3.2-3b",
                                           "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-1.7b"};
    for (size_t i = 0; i < PSV_ARRAY_LEN(required); i++) CHECKF(models_find(required[i]), "missing %s", required[i]);
    CHECK(models_find(PSV_MODELS_DEFAULT) != NULL);
    CHECK(models_find("PHI-4-Mini") == models_find("phi-4-mini"));
    CHECK(models_find("phi-4-min") == NULL && models_find("") == NULL && models_find(NULL) == NULL);
    for (size_t i = 0; i < n; i++) {
        const models_entry *e = &models_registry[i];
        for (const char *c = e->name; *c; c++)
            CHECKF((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-', "%s: name", e->name);
        for (size_t j = i + 1; j < n; j++) {
            CHECKF(!models_ascii_ieq(e->name, models_registry[j].name), "duplicate name %s", e->name);
            CHECKF(strcmp(e->file, models_registry[j].file) != 0, "duplicate file %s", e->file);
        }
        CHECKF(models_find(e->name) == e && models_find_file(e->file) == e, "%s: lookups", e->name);
        CHECKF(e->size >= 100000000u && e->size <= 50000000000u, "%s: size %" PRIu64, e->name, e->size);
        CHECKF(e->sha256[0] == 0 || all_hex_lower(e->sha256, 64), "%s: sha256 '%s'", e->name, e->sha256);
        CHECKF(all_hex_lower(e->revision, 40), "%s: revision '%s'", e->name, e->revision);
        const char *slash = strchr(e->repo, '/');
        CHECKF(slash && slash != e->repo && slash[1] && !strchr(slash + 1, '/'), "%s: repo '%s'", e->name, e->repo);
        CHECKF(models_safe_filename(e->file) && models_has_suffix(e->file, ".gguf"), "%s: file '%s'", e->name, e->file);
        bool arch_ok = false;
        for (size_t k = 0; k < PSV_ARRAY_LEN(model_arch_names); k++) arch_ok |= !strcmp(e->arch, model_arch_names[k]);
        CHECKF(arch_ok, "%s: arch '%s' is not one the engine runs", e->name, e->arch);
        chat_format f;
        CHECKF(chat_format_by_name(e->chat_format, &f), "%s: chat format '%s' unknown", e->name, e->chat_format);
        CHECKF(e->quant[0] && e->title[0] && e->params[0], "%s: labels", e->name);
        char url[1024];
        CHECK(models_url(e, NULL, url, sizeof url, NULL) == PSV_OK);
        char fname[256];
        CHECKF(models_url_filename(url, fname, sizeof fname) && !strcmp(fname, e->file), "%s: URL '%s'", e->name, url);
    }
}

static void test_url(void) {
    const models_entry *e = models_find("qwen3-1.7b");
    char url[512];
    CHECK(models_url(e, NULL, url, sizeof url, NULL) == PSV_OK);
    CHECK(!strcmp(url, "https://huggingface.co/unsloth/Qwen3-1.7B-GGUF/resolve/d7f544eead698dbd1f15126ef60b45a1e1933222/"
                       "Qwen3-1.7B-Q4_K_M.gguf"));
    CHECK(models_url(e, "http://127.0.0.1:8080//", url, sizeof url, NULL) == PSV_OK);
    CHECK(!strcmp(url, "http://127.0.0.1:8080/unsloth/Qwen3-1.7B-GGUF/resolve/d7f544eead698dbd1f15126ef60b45a1e1933222/"
                       "Qwen3-1.7B-Q4_K_M.gguf"));
    CHECK(models_url(e, "", url, sizeof url, NULL) == PSV_OK && !strncmp(url, "https://huggingface.co/", 23));
    psv_error err = {0};
    CHECK(models_url(e, NULL, url, 40, &err) == PSV_ERR_RANGE && strstr(err.message, "qwen3-1.7b"));
}

static void test_parsers(void) {
    char hex[65];
    const char *d = "01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2";
    const char *D = "01999F17C39CC3074AFAE5E9C539BC82D45F2DD7FAA3917C66CBEF76FCE8C0C2";
    CHECK(models_parse_hex64(d, 64, hex) && !strcmp(hex, d));
    CHECK(models_parse_hex64(D, 64, hex) && !strcmp(hex, d));
    CHECK(!models_parse_hex64(d, 63, hex) && !models_parse_hex64(NULL, 64, hex));
    char bad[65];
    memcpy(bad, d, 65);
    bad[10] = 'g';
    CHECK(!models_parse_hex64(bad, 64, hex));

    static const struct {
        const char *v;
        bool ok;
    } etags[] = {
        {"\"01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2\"", true},
        {"01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2", true},
        {"  \"01999F17C39CC3074AFAE5E9C539BC82D45F2DD7FAA3917C66CBEF76FCE8C0C2\"\r\n", true},
        {"W/\"01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2\"", false}, // weak
        {"\"01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c\"", false},    // 63
        {"\"abc-123\"", false},
        {"\"\"", false},
        {"", false},
        {"\"01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2", false}, // unbalanced
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(etags); i++) {
        bool got = models_etag_digest(etags[i].v, strlen(etags[i].v), hex);
        CHECKF(got == etags[i].ok, "etag %zu '%s'", i, etags[i].v);
        if (got) CHECK(!strcmp(hex, d));
    }

    static const struct {
        const char *v;
        bool ok;
        uint64_t first, last, complete;
    } ranges[] = {
        {"bytes 0-499/1234", true, 0, 499, 1234},
        {"bytes 900000-2999999/3000000", true, 900000, 2999999, 3000000},
        {"bytes 5-5/*", true, 5, 5, UINT64_MAX},
        {"bytes */3000000", true, UINT64_MAX, UINT64_MAX, 3000000},
        {"  bytes 1-2/3  ", true, 1, 2, 3},
        {"bytes 0-9999999999999/10000000000000", true, 0, 9999999999999u, 10000000000000u},
        {"bytes */*", false, 0, 0, 0},
        {"bytes 5-4/10", false, 0, 0, 0},   // last before first
        {"bytes 0-10/10", false, 0, 0, 0},  // last past the end
        {"bytes 0-/10", false, 0, 0, 0},
        {"bytes -5/10", false, 0, 0, 0},
        {"bytes 0-5", false, 0, 0, 0},
        {"items 0-5/10", false, 0, 0, 0},
        {"bytes0-5/10", false, 0, 0, 0},
        {"bytes 0-5/10x", false, 0, 0, 0},
        {"bytes 0-18446744073709551616/1", false, 0, 0, 0}, // overflow
        {"bytes */18446744073709551615", false, 0, 0, 0},   // the "unknown" value is no length
        {"bytes 18446744073709551615-18446744073709551615/*", false, 0, 0, 0},
        {"bytes 0-18446744073709551614/18446744073709551615", false, 0, 0, 0},
        {"bytes 0-18446744073709551613/18446744073709551614", true, 0, 18446744073709551613u, 18446744073709551614u},
        {"", false, 0, 0, 0},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(ranges); i++) {
        uint64_t f = 7, l = 7, c = 7;
        bool got = models_parse_content_range(ranges[i].v, strlen(ranges[i].v), &f, &l, &c);
        CHECKF(got == ranges[i].ok, "content-range %zu '%s'", i, ranges[i].v);
        if (got && ranges[i].ok)
            CHECKF(f == ranges[i].first && l == ranges[i].last && c == ranges[i].complete,
                   "content-range %zu: %" PRIu64 " %" PRIu64 " %" PRIu64, i, f, l, c);
    }

    static const struct {
        const char *url, *want; // want NULL: refused
    } urls[] = {
        {"https://huggingface.co/a/b/resolve/main/model.gguf", "model.gguf"},
        {"http://127.0.0.1:8/x/y.gguf?download=true", "y.gguf"},
        {"http://h/p/z.gguf#frag", "z.gguf"},
        {"http://h/model.gguf", "model.gguf"},
        {"http://h/", NULL},
        {"http://h", NULL},
        {"http://h/a/..", NULL},
        {"http://h/a/.hidden", NULL},
        {"http://h/a/b%20c.gguf", NULL},
        {"no-scheme/model.gguf", NULL},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(urls); i++) {
        char out[64];
        bool got = models_url_filename(urls[i].url, out, sizeof out);
        CHECKF(got == (urls[i].want != NULL), "url %zu '%s'", i, urls[i].url);
        if (got && urls[i].want) CHECKF(!strcmp(out, urls[i].want), "url %zu: '%s'", i, out);
    }
    CHECK(models_safe_filename("Qwen3-1.7B-Q4_K_M.gguf") && models_safe_filename("a+b_c.d-e"));
    CHECK(!models_safe_filename("") && !models_safe_filename(".") && !models_safe_filename("..") &&
          !models_safe_filename("a/b") && !models_safe_filename("a b") && !models_safe_filename(NULL));

    static const struct {
        uint64_t n;
        const char *want;
    } sizes[] = {{0, "0 B"}, {999, "999 B"}, {1000, "1.0 kB"}, {397808192u, "397.8 MB"},
                 {2491874688u, "2.49 GB"}, {9053114816u, "9.05 GB"}};
    for (size_t i = 0; i < PSV_ARRAY_LEN(sizes); i++) {
        char out[32];
        models_human_size(sizes[i].n, out);
        CHECKF(!strcmp(out, sizes[i].want), "size %" PRIu64 ": '%s'", sizes[i].n, out);
    }
}

static void test_sidecar_and_state(void) {
    char path[512], side[600], hex[65];
    const char *d = "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653";
    snprintf(path, sizeof path, "%s/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", tmp_dir);
    snprintf(side, sizeof side, "%s.sha256", path);
    psv_error err = {0};
    CHECK(models_sidecar_read(path, hex, &err) == PSV_ERR_IO);
    CHECK(models_sidecar_write(tmp_dir, "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", d, NULL) == PSV_OK);
    char *text = NULL;
    CHECK(plat_read_file(side, &text, NULL, NULL) == PSV_OK && text &&
          !strcmp(text, "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653  "
                        "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf\n"));
    free(text);
    CHECK(models_sidecar_read(path, hex, NULL) == PSV_OK && !strcmp(hex, d));
    const models_entry *e = models_find("qwen2.5-0.5b");
    CHECK(models_file_state(path, e->size, e) == MODELS_VERIFIED);
    CHECK(models_file_state(path, 1234, e) == MODELS_MISMATCH);  // wrong size
    CHECK(models_file_state(path, 1234, NULL) == MODELS_VERIFIED); // nothing to say about the size
    write_file(side, "6EB923E7D26E9CEA28811E1A8E852009B21242FB157B26149D3B188F3A8C8653 *x\n"); // binary mode
    CHECK(models_sidecar_read(path, hex, NULL) == PSV_OK && !strcmp(hex, d));
    write_file(side, "01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2\n");
    CHECK(models_file_state(path, e->size, e) == MODELS_MISMATCH); // not the registry's digest
    write_file(side, "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653");
    CHECK(models_sidecar_read(path, hex, NULL) == PSV_OK);
    static const char *const bad[] = {"", "xyz\n", "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c865\n",
                                      "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653x\n"};
    for (size_t i = 0; i < PSV_ARRAY_LEN(bad); i++) {
        write_file(side, bad[i]);
        psv_error e2 = {0};
        CHECKF(models_sidecar_read(path, hex, &e2) == PSV_ERR_FORMAT, "bad sidecar %zu", i);
        CHECK(models_file_state(path, 1, NULL) == MODELS_MISMATCH);
    }
    unlink(side);
    CHECK(models_file_state(path, 1, NULL) == MODELS_UNVERIFIED);
    CHECK(!strcmp(models_state_name(MODELS_VERIFIED), "verified"));
}

static void test_lock(void) {
    int fd = -1;
    long holder = 0;
    CHECK(models_lock(tmp_dir, "locked.gguf", false, NULL, NULL, &fd, &holder, NULL) == PSV_OK && fd >= 0);
    char lock_path[512];
    snprintf(lock_path, sizeof lock_path, "%s/locked.gguf.lock", tmp_dir);
    CHECK(access(lock_path, F_OK) == 0);
    // fcntl locks are per process: ask a child.
    pid_t pid = fork();
    if (pid == 0) {
        int cfd = -1;
        long h = 0;
        psv_status st = models_lock(tmp_dir, "locked.gguf", false, NULL, NULL, &cfd, &h, NULL);
        _exit(st == PSV_ERR_RANGE && h == (long)getppid() ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    models_unlock(tmp_dir, "locked.gguf", fd);
    CHECK(access(lock_path, F_OK) != 0); // the holder removes it
    pid = fork();
    if (pid == 0) {
        int cfd = -1;
        psv_status st = models_lock(tmp_dir, "locked.gguf", false, NULL, NULL, &cfd, NULL, NULL);
        models_unlock(tmp_dir, "locked.gguf", cfd);
        _exit(st == PSV_OK ? 0 : 1);
    }
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    models_unlock(tmp_dir, "x", -1); // a no-op
}

static void test_resolve(void) {
    char cache[300], path[MODELS_PATH_MAX];
    snprintf(cache, sizeof cache, "%s/cache", tmp_dir);
    CHECK(models_mkdir_p(cache, NULL) == PSV_OK);
    CHECK(models_mkdir_p(cache, NULL) == PSV_OK); // exists: fine
    setenv("PENSIEVE_HOME", cache, 1);
    unsetenv("PENSIEVE_MODEL");
    unsetenv("PENSIEVE_MIRROR");
    models_resolved r;
    psv_error err = {0};

    CHECK(models_resolve_ex("no-such-model", &r, &err) == PSV_ERR_INVALID);
    CHECK(strstr(err.message, "no-such-model") && strstr(err.message, "phi-4-mini") && strstr(err.message, "qwen3-1.7b"));

    err = (psv_error){0};
    CHECK(models_resolve_ex("qwen3-1.7b", &r, &err) == PSV_ERR_IO);
    CHECK(r.missing && r.entry == models_find("qwen3-1.7b"));
    snprintf(path, sizeof path, "%s/Qwen3-1.7B-Q4_K_M.gguf", cache);
    CHECK(!strcmp(r.path, path));
    CHECKF(strstr(err.message, "pensieve pull qwen3-1.7b") && strstr(err.message, "curl -fL") &&
               strstr(err.message, "https://huggingface.co/unsloth/Qwen3-1.7B-GGUF/resolve/") &&
               strstr(err.message, "b139949c5bd74937ad8ed8c8cf3d9ffb1e99c866c823204dc42c0d91fa181897"),
           "message: %s", err.message);
    buf_t help = {0};
    models_fetch_help(r.entry, r.path, "http://mirror.example/", &help);
    CHECK(!help.oom && strstr(help.data, "'http://mirror.example/unsloth/Qwen3-1.7B-GGUF/resolve/") &&
          strstr(help.data, "pensieve pull qwen3-1.7b\n"));
    buf_free(&help);
    buf_t q = {0};
    models_shell_quote(&q, "/a b/it's");
    CHECK(!q.oom && !strcmp(q.data, "'/a b/it'\\''s'"));
    buf_free(&q);

    setenv("PENSIEVE_MIRROR", "http://127.0.0.1:9", 1);
    err = (psv_error){0};
    CHECK(models_resolve_ex("qwen3-1.7b", &r, &err) == PSV_ERR_IO && strstr(err.message, "http://127.0.0.1:9/unsloth/"));
    unsetenv("PENSIEVE_MIRROR");

    write_file(path, "not really a model");
    err = (psv_error){0};
    CHECK(models_resolve_ex("QWEN3-1.7B", &r, &err) == PSV_OK && !r.missing && !strcmp(r.path, path));
    CHECK(r.state == MODELS_UNVERIFIED);
    CHECK(models_resolve("qwen3-1.7b", path, sizeof path, NULL) == PSV_OK && strstr(path, "/cache/Qwen3-1.7B"));
    char tiny[8];
    CHECK(models_resolve("qwen3-1.7b", tiny, sizeof tiny, NULL) == PSV_ERR_RANGE);

    // NULL: $PENSIEVE_MODEL, else the default.
    setenv("PENSIEVE_MODEL", "qwen3-1.7b", 1);
    CHECK(models_resolve_ex(NULL, &r, NULL) == PSV_OK && r.entry == models_find("qwen3-1.7b"));
    CHECK(models_resolve_ex("", &r, NULL) == PSV_OK && r.entry == models_find("qwen3-1.7b"));
    unsetenv("PENSIEVE_MODEL");
    err = (psv_error){0};
    CHECK(models_resolve_ex(NULL, &r, &err) == PSV_ERR_IO && r.missing && r.entry == models_find(PSV_MODELS_DEFAULT));
    CHECK(strstr(err.message, "pensieve pull " PSV_MODELS_DEFAULT) != NULL);

    // Paths.
    char file[512];
    snprintf(file, sizeof file, "%s/mine.gguf", tmp_dir);
    write_file(file, "x");
    CHECK(models_resolve_ex(file, &r, NULL) == PSV_OK && !strcmp(r.path, file) && !r.entry && !r.missing);
    err = (psv_error){0};
    CHECK(models_resolve_ex("/nonexistent/dir/m.gguf", &r, &err) == PSV_ERR_IO && strstr(err.message, "no such file"));
    err = (psv_error){0};
    CHECK(models_resolve_ex("nonexistent.gguf", &r, &err) == PSV_ERR_IO);
    CHECK(models_resolve_ex(tmp_dir, &r, NULL) == PSV_ERR_IO); // a directory
    // A bare file name found in the cache directory (where URL pulls go).
    snprintf(file, sizeof file, "%s/pulled.gguf", cache);
    write_file(file, "y");
    CHECK(models_resolve_ex("pulled.gguf", &r, NULL) == PSV_OK && !strcmp(r.path, file));
    // A path to a registry file knows its entry.
    snprintf(file, sizeof file, "%s/Qwen3-1.7B-Q4_K_M.gguf", cache);
    CHECK(models_resolve_ex(file, &r, NULL) == PSV_OK && r.entry == models_find("qwen3-1.7b"));
}

static void test_tools(void) {
    char tool[MODELS_PATH_MAX];
    setenv("PENSIEVE_PULL", "/bin/sh", 1);
    CHECK(models_find_pull_tool(tool, sizeof tool) && !strcmp(tool, "/bin/sh"));
    setenv("PENSIEVE_PULL", "/nonexistent/pensieve-pull", 1);
    CHECK(!models_find_pull_tool(tool, sizeof tool));
    char *argv_ok[] = {"sh", "-c", "exit 3", NULL};
    CHECK(models_run_tool("/bin/sh", argv_ok) == 3);
    char *argv_sig[] = {"sh", "-c", "kill -TERM $$", NULL};
    CHECK(models_run_tool("/bin/sh", argv_sig) == 128 + SIGTERM);

    // models_ensure: the zero-config path, with stand-ins for pensieve-pull.
    char cache[512], script[512], good[512];
    snprintf(cache, sizeof cache, "%s/ensure", tmp_dir);
    setenv("PENSIEVE_HOME", cache, 1);
    unsetenv("PENSIEVE_MODEL");
    FILE *log = fopen("/dev/null", "w");
    models_resolved r;
    psv_error err = {0};
    CHECK(models_ensure("llama-3.2-1b", NULL, false, log, &r, &err) == PSV_ERR_IO && r.missing);
    CHECK(strstr(err.message, "llama-3.2-1b") != NULL);
    err = (psv_error){0};
    CHECK(models_ensure("llama-3.2-1b", NULL, true, log, &r, &err) == PSV_ERR_IO); // no tool
    CHECK(strstr(err.message, "pensieve-pull was not found") != NULL);
    snprintf(script, sizeof script, "%s/fail-pull", tmp_dir);
    write_file(script, "#!/bin/sh\nexit 1\n");
    chmod(script, 0755);
    setenv("PENSIEVE_PULL", script, 1);
    err = (psv_error){0};
    CHECK(models_ensure("llama-3.2-1b", NULL, true, log, &r, &err) == PSV_ERR_IO && strstr(err.message, "exit status 1"));
    // A stand-in that checks its arguments and creates the file where pensieve-pull would.
    snprintf(good, sizeof good, "%s/good-pull", tmp_dir);
    write_file(good, "#!/bin/sh\n[ \"$1\" = llama-3.2-1b ] && [ \"$2\" = --mirror ] && [ \"$3\" = http://m.test ] || exit 9\n"
                     "mkdir -p \"$PENSIEVE_HOME\" && echo x > \"$PENSIEVE_HOME/Llama-3.2-1B-Instruct-Q4_K_M.gguf\"\n");
    chmod(good, 0755);
    setenv("PENSIEVE_PULL", good, 1);
    err = (psv_error){0};
    CHECKF(models_ensure("llama-3.2-1b", "http://m.test", true, log, &r, &err) == PSV_OK && !r.missing,
           "ensure: %s", err.message);
    CHECK(models_ensure("llama-3.2-1b", NULL, true, log, &r, NULL) == PSV_OK); // present now: no pull
    CHECK(models_ensure("no-such-model", NULL, true, log, &r, NULL) == PSV_ERR_INVALID);
    fclose(log);
    unsetenv("PENSIEVE_PULL");
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "%s/psv_test_models.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    test_cache_dir();
    if (home) setenv("HOME", home, 1);
    test_registry();
    test_url();
    test_parsers();
    test_sidecar_and_state();
    test_lock();
    test_resolve();
    test_tools();
    free(home);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return t_finish();
}
