// tests/test_gguf.c — GGUF reader, writer and info report.
//
// Malformed files are built byte by byte (the writer refuses to make them) and each must fail
// with its status and a distinctive message; a small valid file must fail when cut at every byte;
// everything the writer can express must read back identically; the shared models and
// vocabularies must open and show known facts.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

// ---- byte builder for malformed files ----

static void tb_u32(buf_t *b, uint32_t v) { gw_u32(b, v); }
static void tb_u64(buf_t *b, uint64_t v) { gw_u64(b, v); }
static void tb_str(buf_t *b, const char *s) { gw_str(b, s, strlen(s)); }
static void tb_hdr(buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    buf_append(b, "GGUF", 4);
    tb_u32(b, version);
    tb_u64(b, n_tensors);
    tb_u64(b, n_kv);
}
static void tb_kv_u32(buf_t *b, const char *key, uint32_t v) {
    tb_str(b, key);
    tb_u32(b, GGUF_T_UINT32);
    tb_u32(b, v);
}
// A tensor info with up to 5 dims (to test the limit).
static void tb_tensor(buf_t *b, const char *name, uint32_t type, uint64_t offset, uint32_t n_dims, const uint64_t *ne) {
    tb_str(b, name);
    tb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) tb_u64(b, ne[d]);
    tb_u32(b, type);
    tb_u64(b, offset);
}
static void tb_zeros(buf_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) buf_putc(b, 0);
}
static void tb_pad(buf_t *b, size_t align) { tb_zeros(b, (align - b->len % align) % align); }

// One F32 tensor of ne0 values at offset 0, padded and with its data: a valid base to vary.
static void tb_one_tensor(buf_t *b, uint32_t type, uint64_t ne0, uint64_t offset, size_t data) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", type, offset, 1, (uint64_t[]){ne0});
    tb_pad(b, 32);
    tb_zeros(b, data);
}

static void c_empty(buf_t *b) { (void)b; }
static void c_bad_magic(buf_t *b) { buf_append(b, "GGUX\3\0\0\0", 8); tb_zeros(b, 16); }
static void c_legacy(buf_t *b) { buf_append(b, "tjgg\3\0\0\0", 8); tb_zeros(b, 16); }
static void c_v1(buf_t *b) { tb_hdr(b, 1, 0, 0); }
static void c_v4(buf_t *b) { tb_hdr(b, 4, 0, 0); }
static void c_big_endian(buf_t *b) { tb_hdr(b, 0x03000000u, 0, 0); }
static void c_v0(buf_t *b) { tb_hdr(b, 0, 0, 0); }
static void c_short_header(buf_t *b) { buf_append(b, "GGUF\3\0\0\0\0\0", 10); }
static void c_huge_tensors(buf_t *b) { tb_hdr(b, 3, 1ull << 60, 0); tb_zeros(b, 100); }
static void c_huge_kv(buf_t *b) { tb_hdr(b, 3, 0, 1ull << 60); tb_zeros(b, 100); }
static void c_kv_over_limit(buf_t *b) {
    tb_hdr(b, 3, 0, PSV_GGUF_MAX_KV + 1);
    tb_zeros(b, (size_t)(PSV_GGUF_MAX_KV + 1) * GGUF_MIN_KV_SIZE);
}
static void c_key_past_end(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_u64(b, 1000); tb_zeros(b, 10); }
static void c_value_past_end(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "general.name");
    tb_u32(b, GGUF_T_STRING);
    tb_u64(b, 5000);
    buf_puts(b, "abc");
}
static void c_arr_overflow(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_UINT64);
    tb_u64(b, 1ull << 62);
    tb_zeros(b, 16);
}
static void c_arr_past_end(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_UINT32);
    tb_u64(b, 1000);
    tb_zeros(b, 16);
}
static void c_str_arr_past_end(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_STRING);
    tb_u64(b, 1000);
    tb_zeros(b, 16);
}
static void c_arr_over_limit(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_UINT8);
    tb_u64(b, (uint64_t)PSV_GGUF_MAX_ARRAY + 1);
    tb_zeros(b, (size_t)PSV_GGUF_MAX_ARRAY + 1);
}
static void c_nested_arr(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_ARRAY);
    tb_u64(b, 1);
    tb_zeros(b, 16);
}
static void c_bad_vtype(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_str(b, "a"); tb_u32(b, 13); tb_zeros(b, 8); }
static void c_bad_elem_type(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, 99);
    tb_u64(b, 1);
    tb_zeros(b, 8);
}
static void c_bad_bool(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_str(b, "a"); tb_u32(b, GGUF_T_BOOL); buf_putc(b, 2); }
static void c_bad_bool_arr(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "a");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_BOOL);
    tb_u64(b, 3);
    buf_append(b, "\1\0\7", 3);
}
static void c_str_elem_past_end(buf_t *b) { // the third string of an array runs past the end
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "tokenizer.ggml.tokens");
    tb_u32(b, GGUF_T_ARRAY);
    tb_u32(b, GGUF_T_STRING);
    tb_u64(b, 3);
    tb_str(b, "one");
    tb_str(b, "two");
    tb_u64(b, 900);
    buf_puts(b, "three, but short of 900 bytes; padding to pass the array's size check........");
}
static void c_dup_key(buf_t *b) { tb_hdr(b, 3, 0, 2); tb_kv_u32(b, "a.b", 1); tb_kv_u32(b, "a.b", 2); }
static void c_empty_key(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_kv_u32(b, "", 1); }
static void c_nul_key(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_u64(b, 3);
    buf_append(b, "a\0b", 3);
    tb_u32(b, GGUF_T_UINT8);
    buf_putc(b, 1);
}
static void c_utf8_key(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_kv_u32(b, "a\xc0\x80", 1); }
static void c_align0(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_kv_u32(b, "general.alignment", 0); }
static void c_align3(buf_t *b) { tb_hdr(b, 3, 0, 1); tb_kv_u32(b, "general.alignment", 3); }
static void c_align_type(buf_t *b) {
    tb_hdr(b, 3, 0, 1);
    tb_str(b, "general.alignment");
    tb_u32(b, GGUF_T_UINT64);
    tb_u64(b, 32);
}
static void c_dims0(buf_t *b) { tb_hdr(b, 3, 1, 0); tb_tensor(b, "w", T_F32, 0, 0, NULL); tb_zeros(b, 64); }
static void c_dims5(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", T_F32, 0, 5, (uint64_t[]){1, 1, 1, 1, 1});
    tb_zeros(b, 64);
}
static void c_dim_zero(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", T_F32, 0, 2, (uint64_t[]){4, 0});
    tb_zeros(b, 64);
}
static void c_dim_negative(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", T_F32, 0, 1, (uint64_t[]){1ull << 63});
    tb_zeros(b, 64);
}
static void c_dims_overflow(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", T_F32, 0, 3, (uint64_t[]){1ull << 32, 1ull << 32, 4});
    tb_zeros(b, 64);
}
static void c_size_overflow(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "w", T_F32, 0, 2, (uint64_t[]){1ull << 31, 1ull << 31}); // 2^62 elements, 2^64 bytes
    tb_zeros(b, 64);
}
static void c_type4(buf_t *b) { tb_one_tensor(b, 4, 32, 0, 64); }
static void c_type99(buf_t *b) { tb_one_tensor(b, 99, 32, 0, 64); }
static void c_row_blocks(buf_t *b) { tb_one_tensor(b, T_Q4_0, 100, 0, 64); }
static void c_out_of_file(buf_t *b) { tb_one_tensor(b, T_F32, 64, 0, 100); }
static void c_offset_out(buf_t *b) { tb_one_tensor(b, T_F32, 4, 1ull << 62, 64); }
static void c_misaligned(buf_t *b) { tb_one_tensor(b, T_F32, 4, 8, 64); }
static void c_overlap(buf_t *b) {
    tb_hdr(b, 3, 2, 0);
    tb_tensor(b, "a", T_F32, 0, 1, (uint64_t[]){16});  // bytes 0..64
    tb_tensor(b, "b", T_F32, 32, 1, (uint64_t[]){16}); // bytes 32..96
    tb_pad(b, 32);
    tb_zeros(b, 128);
}
static void c_dup_tensor(buf_t *b) {
    tb_hdr(b, 3, 2, 0);
    tb_tensor(b, "a", T_F32, 0, 1, (uint64_t[]){8});
    tb_tensor(b, "a", T_F32, 32, 1, (uint64_t[]){8});
    tb_pad(b, 32);
    tb_zeros(b, 64);
}
static void c_empty_name(buf_t *b) {
    tb_hdr(b, 3, 1, 0);
    tb_tensor(b, "", T_F32, 0, 1, (uint64_t[]){8});
    tb_zeros(b, 64);
}
static void c_tensor_trunc(buf_t *b) { // 3 dims announced, 16 bytes left after the first
    tb_hdr(b, 3, 1, 0);
    tb_str(b, "w");
    tb_u32(b, 3);
    tb_u64(b, 8);
    tb_zeros(b, 16);
}

typedef struct {
    const char *name;
    void (*build)(buf_t *b);
    psv_status status;
    const char *msg;
} bad_case;

static const bad_case bad_cases[] = {
    {"empty file", c_empty, PSV_ERR_FORMAT, "too small for a GGUF header"},
    {"bad magic", c_bad_magic, PSV_ERR_FORMAT, "bad magic (expected \"GGUF\" = 47 47 55 46, got 47 47 55 58)"},
    {"legacy magic", c_legacy, PSV_ERR_FORMAT, "legacy GGML/GGJT"},
    {"version 1", c_v1, PSV_ERR_UNSUPPORTED, "version 1 is not supported"},
    {"version 4", c_v4, PSV_ERR_UNSUPPORTED, "unsupported version (expected 2 or 3, got 4)"},
    {"big-endian", c_big_endian, PSV_ERR_UNSUPPORTED, "big-endian"},
    {"version 0", c_v0, PSV_ERR_UNSUPPORTED, "unsupported version (expected 2 or 3, got 0)"},
    {"short header", c_short_header, PSV_ERR_FORMAT, "header: truncated"},
    {"huge n_tensors", c_huge_tensors, PSV_ERR_FORMAT, "header claims 1152921504606846976 tensors"},
    {"huge n_kv", c_huge_kv, PSV_ERR_FORMAT, "header claims 1152921504606846976 metadata keys"},
    {"n_kv over limit", c_kv_over_limit, PSV_ERR_RANGE, "metadata keys exceed the limit"},
    {"key past end", c_key_past_end, PSV_ERR_FORMAT, "key #0: string of 1000 bytes runs past the end"},
    {"value past end", c_value_past_end, PSV_ERR_FORMAT, "key 'general.name': string of 5000 bytes runs past"},
    {"array count overflow", c_arr_overflow, PSV_ERR_FORMAT, "array count 4611686018427387904 overflows"},
    {"array past end", c_arr_past_end, PSV_ERR_FORMAT, "array of 1000 UINT32 (4000 bytes) runs past the end"},
    {"string array past end", c_str_arr_past_end, PSV_ERR_FORMAT, "array of 1000 strings runs past the end"},
    {"array over limit", c_arr_over_limit, PSV_ERR_RANGE, "elements exceeds the limit"},
    {"nested array", c_nested_arr, PSV_ERR_UNSUPPORTED, "arrays of arrays are not supported"},
    {"unknown value type", c_bad_vtype, PSV_ERR_FORMAT, "key 'a': unknown value type 13"},
    {"unknown element type", c_bad_elem_type, PSV_ERR_FORMAT, "unknown array element type 99"},
    {"bool 2", c_bad_bool, PSV_ERR_FORMAT, "bool value 2 (expected 0 or 1)"},
    {"bool array 7", c_bad_bool_arr, PSV_ERR_FORMAT, "element 2: bool value 7"},
    {"string array element past end", c_str_elem_past_end, PSV_ERR_FORMAT,
     "key 'tokenizer.ggml.tokens': element 2: string of 900 bytes runs past the end"},
    {"duplicate key", c_dup_key, PSV_ERR_FORMAT, "duplicate key 'a.b' (entries #0 and #1)"},
    {"empty key", c_empty_key, PSV_ERR_FORMAT, "key: empty name"},
    {"NUL in key", c_nul_key, PSV_ERR_FORMAT, "name contains a NUL byte"},
    {"overlong UTF-8 key", c_utf8_key, PSV_ERR_FORMAT, "name is not valid UTF-8"},
    {"alignment 0", c_align0, PSV_ERR_FORMAT, "not a power of two (expected 1, 2, 4, ..., got 0)"},
    {"alignment 3", c_align3, PSV_ERR_FORMAT, "not a power of two (expected 1, 2, 4, ..., got 3)"},
    {"alignment type", c_align_type, PSV_ERR_FORMAT, "wrong type (expected UINT32, got UINT64)"},
    {"n_dims 0", c_dims0, PSV_ERR_FORMAT, "tensor 'w': 0 dimensions (expected 1 to 4)"},
    {"n_dims 5", c_dims5, PSV_ERR_FORMAT, "tensor 'w': 5 dimensions (expected 1 to 4)"},
    {"dimension 0", c_dim_zero, PSV_ERR_FORMAT, "dimension 1 is 0"},
    {"dimension > INT64_MAX", c_dim_negative, PSV_ERR_FORMAT, "dimension 0 is 9223372036854775808"},
    {"element count overflow", c_dims_overflow, PSV_ERR_FORMAT, "element count overflows at dimension 1"},
    {"byte size overflow", c_size_overflow, PSV_ERR_FORMAT, "byte size overflows"},
    {"type id 4", c_type4, PSV_ERR_FORMAT, "tensor type 4 is unknown or retired"},
    {"type id 99", c_type99, PSV_ERR_FORMAT, "tensor type 99 is unknown or retired"},
    {"row not whole blocks", c_row_blocks, PSV_ERR_FORMAT,
     "row length 100 is not a multiple of the Q4_0 block size 32"},
    {"data out of file", c_out_of_file, PSV_ERR_FORMAT, "tensor 'w': data ends at 320 but the file has 164 bytes"},
    {"offset out of file", c_offset_out, PSV_ERR_FORMAT, "tensor 'w': data ends at 4611686018427387984"},
    {"misaligned offset", c_misaligned, PSV_ERR_FORMAT, "offset 8 is not a multiple of the alignment 32"},
    {"overlapping tensors", c_overlap, PSV_ERR_FORMAT, "tensors 'a' and 'b' overlap"},
    {"duplicate tensor", c_dup_tensor, PSV_ERR_FORMAT, "duplicate tensor name 'a' (tensors #0 and #1)"},
    {"empty tensor name", c_empty_name, PSV_ERR_FORMAT, "tensor: empty name"},
    {"truncated tensor info", c_tensor_trunc, PSV_ERR_FORMAT, "tensor 'w': truncated"},
};

static void test_bad_files(void) {
    for (size_t i = 0; i < PSV_ARRAY_LEN(bad_cases); i++) {
        const bad_case *c = &bad_cases[i];
        buf_t b = {0};
        c->build(&b);
        CHECK(!b.oom);
        gguf_file *f = (gguf_file *)1;
        psv_error err = {0};
        psv_status st = gguf_open_mem(b.data, b.len, &f, &err);
        CHECKF(st == c->status, "%s: status %s, expected %s (%s)", c->name, psv_status_name(st),
               psv_status_name(c->status), err.message);
        CHECKF(strstr(err.message, c->msg) != NULL, "%s: message '%s' lacks '%s'", c->name, err.message, c->msg);
        CHECKF(strncmp(err.message, "gguf: ", 6) == 0, "%s: message '%s'", c->name, err.message);
        CHECK(f == NULL);
        gguf_close(f);
        buf_free(&b);
    }
}

// ---- writer ----

static psv_status fill_pattern(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err) {
    (void)err;
    uint8_t chunk[1000];
    uint64_t seed = *(const uint64_t *)user;
    for (uint64_t done = 0; done < t->size;) {
        size_t k = (size_t)PSV_MIN((uint64_t)sizeof chunk, t->size - done);
        for (size_t i = 0; i < k; i++) chunk[i] = (uint8_t)((done + i) * 7 + seed);
        gguf_sink_write(out, chunk, k);
        done += k;
    }
    return PSV_OK;
}

static psv_status fill_short(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err) {
    (void)user; (void)err;
    gguf_sink_write(out, "x", t->size > 1 ? 1 : 0);
    return PSV_OK;
}

static psv_status fill_fail(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err) {
    (void)user; (void)t; (void)out;
    return err_set(err, PSV_ERR_IO, "test: source weights unreadable");
}

// Every value type, arrays of every element type, and tensors from a pointer, a callback and
// zeros, at a non-default alignment.
static gguf_writer *build_sample(uint64_t *seed, const float *f32data, uint32_t alignment) {
    gguf_writer *w = gguf_writer_new();
    if (alignment) gguf_w_alignment(w, alignment);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u8(w, "t.u8", 250);
    gguf_w_i8(w, "t.i8", -100);
    gguf_w_u16(w, "t.u16", 65000);
    gguf_w_i16(w, "t.i16", -30000);
    gguf_w_u32(w, "t.u32", 4000000000u);
    gguf_w_i32(w, "t.i32", -2000000000);
    gguf_w_f32(w, "t.f32", 1e-5f);
    gguf_w_bool(w, "t.bool", true);
    gguf_w_u64(w, "t.u64", UINT64_MAX);
    gguf_w_i64(w, "t.i64", INT64_MIN);
    gguf_w_f64(w, "t.f64", 0.1);
    gguf_w_f64(w, "t.f64big", 1e300);
    gguf_w_strn(w, "t.str_nul", "a\0b", 3);
    char longs[300];
    memset(longs, 'x', sizeof longs);
    gguf_w_strn(w, "t.long", longs, sizeof longs);
    static const uint8_t au8[] = {1, 2, 255};
    static const int8_t ai8[] = {-1, 0, 127};
    static const uint16_t au16[] = {1, 65535};
    static const int16_t ai16[] = {-32768, 5};
    static const uint32_t au32[] = {7, 4294967295u};
    static const int32_t ai32[] = {-7, 2147483647};
    static const float af32[] = {0.5f, -2.25f, 3e38f};
    static const bool abool[] = {true, false, true};
    static const uint64_t au64[] = {0, UINT64_MAX};
    static const int64_t ai64[] = {INT64_MIN, -1};
    static const double af64[] = {1.5, -0.125, -1e300};
    gguf_w_arr(w, "a.u8", GGUF_T_UINT8, au8, 3);
    gguf_w_arr(w, "a.i8", GGUF_T_INT8, ai8, 3);
    gguf_w_arr(w, "a.u16", GGUF_T_UINT16, au16, 2);
    gguf_w_arr(w, "a.i16", GGUF_T_INT16, ai16, 2);
    gguf_w_arr(w, "a.u32", GGUF_T_UINT32, au32, 2);
    gguf_w_arr(w, "a.i32", GGUF_T_INT32, ai32, 2);
    gguf_w_arr(w, "a.f32", GGUF_T_FLOAT32, af32, 3);
    gguf_w_arr(w, "a.bool", GGUF_T_BOOL, abool, 3);
    gguf_w_arr(w, "a.u64", GGUF_T_UINT64, au64, 2);
    gguf_w_arr(w, "a.i64", GGUF_T_INT64, ai64, 2);
    gguf_w_arr(w, "a.f64", GGUF_T_FLOAT64, af64, 3);
    gguf_w_arr(w, "a.empty", GGUF_T_INT32, NULL, 0);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81hello", ""};
    gguf_w_arr_str(w, "a.str", toks, 5);
    str_t merges[] = {{"a b", 3}, {"c\0d", 3}};
    gguf_w_arr_strn(w, "a.strn", merges, 2);
    gguf_w_tensor(w, "f32", T_F32, 2, (uint64_t[]){4, 3}, f32data);
    gguf_w_tensor_fn(w, "q4", T_Q4_0, 2, (uint64_t[]){64, 5}, fill_pattern, seed);
    gguf_w_tensor(w, "zero", T_F16, 1, (uint64_t[]){7}, NULL);
    gguf_w_tensor_fn(w, "k4", T_Q4_K, 4, (uint64_t[]){256, 2, 3, 2}, fill_pattern, seed);
    return w;
}

static void check_sample(const gguf_file *f, uint64_t seed, const float *f32data, uint32_t alignment) {
    uint32_t u32 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    bool bv = false;
    str_t s = {0};
    CHECK(f->version == 3);
    CHECK(f->alignment == (alignment ? alignment : 32));
    CHECK(f->n_tensors == 4);
    CHECK(gguf_get_str(f, "general.architecture", &s) && str_eq_c(s, "llama"));
    CHECK(gguf_get_u32(f, "t.u8", &u32) && u32 == 250);
    CHECK(gguf_get_i64(f, "t.i8", &i64) && i64 == -100);
    CHECK(!gguf_get_u32(f, "t.i8", &u32)); // negative
    CHECK(gguf_get_u32(f, "t.u16", &u32) && u32 == 65000);
    CHECK(gguf_get_i64(f, "t.i16", &i64) && i64 == -30000);
    CHECK(gguf_get_u32(f, "t.u32", &u32) && u32 == 4000000000u);
    CHECK(gguf_get_i64(f, "t.i32", &i64) && i64 == -2000000000);
    CHECK(gguf_get_f32(f, "t.f32", &f32) && f32 == 1e-5f);
    CHECK(gguf_get_bool(f, "t.bool", &bv) && bv);
    CHECK(!gguf_get_u32(f, "t.bool", &u32));
    CHECK(!gguf_get_u32(f, "t.u64", &u32)); // out of range
    CHECK(!gguf_get_i64(f, "t.u64", &i64));
    CHECK(gguf_find_kv(f, "t.u64")->v.u == UINT64_MAX);
    CHECK(gguf_get_i64(f, "t.i64", &i64) && i64 == INT64_MIN);
    CHECK(gguf_get_f32(f, "t.f64", &f32) && f32 == 0.1f && gguf_find_kv(f, "t.f64")->v.f == 0.1);
    CHECK(gguf_get_f32(f, "t.u32", &f32) && f32 == 4e9f); // integers convert
    CHECK(!gguf_get_f32(f, "t.f64big", &f32));           // beyond the float range
    CHECK(!gguf_get_f32(f, "general.architecture", &f32));
    CHECK(!gguf_get_str(f, "t.u8", &s));
    CHECK(!gguf_get_bool(f, "missing", &bv));
    CHECK(gguf_get_str(f, "t.str_nul", &s) && s.n == 3 && memcmp(s.p, "a\0b", 3) == 0);
    CHECK(gguf_get_str(f, "t.long", &s) && s.n == 300 && s.p[299] == 'x');

    const gguf_kv *a;
    CHECK((a = gguf_get_arr(f, "a.u8", GGUF_T_UINT8)) && a->arr_n == 3 && gguf_arr_int(a, 2) == 255);
    CHECK(!gguf_get_arr(f, "a.u8", GGUF_T_INT8));
    CHECK((a = gguf_get_arr(f, "a.i8", GGUF_T_INT8)) && gguf_arr_int(a, 0) == -1 && gguf_arr_int(a, 2) == 127);
    CHECK((a = gguf_get_arr(f, "a.u16", GGUF_T_UINT16)) && gguf_arr_int(a, 1) == 65535);
    CHECK((a = gguf_get_arr(f, "a.i16", GGUF_T_INT16)) && gguf_arr_int(a, 0) == -32768);
    CHECK((a = gguf_get_arr(f, "a.u32", GGUF_T_UINT32)) && gguf_arr_int(a, 1) == 4294967295ll);
    CHECK((a = gguf_get_arr(f, "a.i32", GGUF_T_INT32)) && gguf_arr_int(a, 0) == -7 && gguf_arr_int(a, 1) == 2147483647);
    CHECK(gguf_arr_int(a, 2) == 0); // out of range
    CHECK((a = gguf_get_arr(f, "a.f32", GGUF_T_FLOAT32)) && gguf_arr_f32(a, 1) == -2.25f &&
          gguf_arr_f32(a, 2) == 3e38f);
    CHECK(gguf_arr_int(a, 0) == 0); // not integers
    CHECK((a = gguf_get_arr(f, "a.bool", GGUF_T_BOOL)) && gguf_arr_int(a, 0) == 1 && gguf_arr_int(a, 1) == 0);
    CHECK((a = gguf_get_arr(f, "a.u64", GGUF_T_UINT64)) && gguf_arr_int(a, 1) == INT64_MAX); // saturates
    CHECK((a = gguf_get_arr(f, "a.i64", GGUF_T_INT64)) && gguf_arr_int(a, 0) == INT64_MIN);
    CHECK((a = gguf_get_arr(f, "a.f64", GGUF_T_FLOAT64)) && gguf_arr_f32(a, 0) == 1.5f &&
          gguf_arr_f32(a, 1) == -0.125f);
    CHECK(a && f32_bits(gguf_arr_f32(a, 2)) == 0xff800000u); // -inf
    CHECK((a = gguf_get_arr(f, "a.empty", GGUF_T_INT32)) && a->arr_n == 0);
    CHECK((a = gguf_get_arr(f, "a.str", GGUF_T_STRING)) && a->arr_n == 5);
    if (a) {
        CHECK(str_eq_c(gguf_arr_str(a, 0), "<unk>") && str_eq_c(gguf_arr_str(a, 3), "\xe2\x96\x81hello") &&
              gguf_arr_str(a, 4).n == 0);
        CHECK(str_eq_c(gguf_arr_str(a, 2), "</s>") && gguf_arr_str(a, 5).n == 0);
    }
    CHECK((a = gguf_get_arr(f, "a.strn", GGUF_T_STRING)) && a->arr_n == 2 && gguf_arr_str(a, 1).n == 3 &&
          memcmp(gguf_arr_str(a, 1).p, "c\0d", 3) == 0);

    const gguf_tensor *t = gguf_find_tensor(f, "f32");
    CHECK(t && t->type == T_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 1 && t->size == 48);
    if (t) CHECK(memcmp(t->data, f32data, 48) == 0);
    t = gguf_find_tensor(f, "q4");
    CHECK(t && t->type == T_Q4_0 && t->size == 2 * 18 * 5);
    if (t) {
        bool same = true;
        for (uint64_t i = 0; i < t->size; i++) same &= t->data[i] == (uint8_t)(i * 7 + seed);
        CHECK(same);
    }
    t = gguf_find_tensor(f, "zero");
    CHECK(t && t->type == T_F16 && t->size == 14 && t->data[0] == 0 && t->data[13] == 0);
    t = gguf_find_tensor(f, "k4");
    CHECK(t && t->n_dims == 4 && t->ne[3] == 2 && t->size == 144 * 12);
    for (uint64_t k = 0; k < f->n_kv; k++) CHECK(f->kv[k].key.p[f->kv[k].key.n] == 0); // C strings
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        t = &f->tensors[k];
        CHECK(t->name.p[t->name.n] == 0);
        CHECK(t->offset % f->alignment == 0);
        CHECK(t->data == f->base + f->data_offset + t->offset);
    }
    CHECK(f->data_offset % f->alignment == 0);
    CHECK(f->tensor_bytes == 48 + 180 + 14 + 144 * 12);
    CHECK(!gguf_find_tensor(f, "missing") && !gguf_find_kv(f, "missing"));
}

static void test_round_trip(void) {
    uint64_t seed = 11;
    float f32data[12];
    for (int i = 0; i < 12; i++) f32data[i] = (float)i * 0.25f - 1.0f;
    for (int ai = 0; ai < 3; ai++) {
        uint32_t alignment = (uint32_t[]){0, 64, 1}[ai];
        gguf_writer *w = build_sample(&seed, f32data, alignment);
        buf_t b = {0};
        psv_error err = {0};
        CHECKF(gguf_writer_to_buf(w, &b, &err) == PSV_OK, "%s", err.message);
        gguf_file *f = NULL;
        CHECKF(gguf_open_mem(b.data, b.len, &f, &err) == PSV_OK, "%s", err.message);
        if (f) check_sample(f, seed, f32data, alignment);

        // The file ends with the last tensor, so cutting it anywhere must fail, never crash.
        if (ai == 0 && f) {
            int opened = 0;
            for (size_t n = 0; n < b.len; n++) {
                uint8_t *cut = malloc(n ? n : 1);
                memcpy(cut, b.data, n);
                gguf_file *g = NULL;
                psv_error e2 = {0};
                if (gguf_open_mem(cut, n, &g, &e2) == PSV_OK || !e2.message[0]) opened++;
                gguf_close(g);
                free(cut);
            }
            CHECKF(opened == 0, "%d of %zu truncations opened", opened, b.len);

            // Copy every pair through gguf_w_kv and the tensors by pointer: identical metadata bytes.
            gguf_writer *w2 = gguf_writer_new();
            for (uint64_t k = 0; k < f->n_kv; k++) gguf_w_kv(w2, &f->kv[k]);
            for (uint64_t k = 0; k < f->n_tensors; k++) {
                const gguf_tensor *t = &f->tensors[k];
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)t->name.n, t->name.p);
                gguf_w_tensor(w2, name, t->type, t->n_dims, t->ne, t->data);
            }
            buf_t b2 = {0};
            CHECKF(gguf_writer_to_buf(w2, &b2, &err) == PSV_OK, "%s", err.message);
            CHECK(b2.len == b.len && memcmp(b2.data, b.data, b.len) == 0);
            buf_free(&b2);
            gguf_writer_free(w2);

            // The info report shows every section, summarised arrays and cut long strings.
            buf_t r = {0};
            gguf_info(f, "sample", &r);
            CHECK(strstr(r.data, "sample: GGUF v3") != NULL);
            CHECK(strstr(r.data, "[STRING x 5] \"<unk>\", \"<s>\", \"</s>\", \"\xe2\x96\x81hello\", ...") != NULL);
            CHECK(strstr(r.data, "[UINT8 x 3] 1, 2, 255") != NULL);
            CHECK(strstr(r.data, "[BOOL x 3] true, false, true") != NULL);
            CHECK(strstr(r.data, "[FLOAT32 x 3] 0.5, -2.25, 3e+38") != NULL);
            CHECK(strstr(r.data, "FLOAT32  1e-05") != NULL);
            CHECK(strstr(r.data, "FLOAT64  0.1") != NULL);
            CHECK(strstr(r.data, "INT64    -9223372036854775808") != NULL);
            CHECK(strstr(r.data, "\"a\\x00b\"") != NULL);
            CHECK(strstr(r.data, "...\" (300 bytes)") != NULL);
            CHECK(strstr(r.data, "Q4_K") && strstr(r.data, "256 x 2 x 3 x 2"));
            CHECK(strstr(r.data, "tensor bytes  1970") != NULL);
            CHECK(strstr(r.data, "\n  Q4_K           1            1728            3072\n") != NULL);
            buf_free(&r);
        }
        gguf_close(f);
        buf_free(&b);
        gguf_writer_free(w);
    }
}

static void test_writer_errors(void) {
    struct {
        const char *name;
        int which;
        psv_status status;
        const char *msg;
    } cases[] = {
        {"duplicate key", 0, PSV_ERR_INVALID, "duplicate key 'k'"},
        {"alignment 3", 1, PSV_ERR_INVALID, "3 is not a power of two"},
        {"alignment wrong type", 2, PSV_ERR_INVALID, "wrong type (expected UINT32, got UINT64)"},
        {"bad tensor type", 3, PSV_ERR_INVALID, "unknown tensor type 5"},
        {"row not whole blocks", 4, PSV_ERR_INVALID, "not a multiple of the Q8_0 block size 32"},
        {"duplicate tensor", 5, PSV_ERR_INVALID, "duplicate tensor name 't'"},
        {"short callback", 6, PSV_ERR_INVALID, "fill callback wrote 1 bytes (expected 64)"},
        {"failing callback", 7, PSV_ERR_IO, "test: source weights unreadable"},
        {"bad key", 8, PSV_ERR_INVALID, "not valid UTF-8"},
        {"dim 0", 9, PSV_ERR_INVALID, "bad dimension 1 (0)"},
        {"string elem arr", 10, PSV_ERR_INVALID, "takes fixed-size elements"},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        gguf_writer *w = gguf_writer_new();
        gguf_w_u32(w, "k", 1);
        switch (cases[i].which) {
        case 0: gguf_w_f32(w, "k", 2.0f); break;
        case 1: gguf_w_alignment(w, 3); break;
        case 2: gguf_w_u64(w, "general.alignment", 32); break;
        case 3: gguf_w_tensor(w, "t", 5, 1, (uint64_t[]){32}, NULL); break;
        case 4: gguf_w_tensor(w, "t", T_Q8_0, 1, (uint64_t[]){33}, NULL); break;
        case 5:
            gguf_w_tensor(w, "t", T_F32, 1, (uint64_t[]){8}, NULL);
            gguf_w_tensor(w, "t", T_F32, 1, (uint64_t[]){8}, NULL);
            break;
        case 6: gguf_w_tensor_fn(w, "t", T_F32, 1, (uint64_t[]){16}, fill_short, NULL); break;
        case 7: gguf_w_tensor_fn(w, "t", T_F32, 1, (uint64_t[]){16}, fill_fail, NULL); break;
        case 8: gguf_w_u8(w, "bad\xff", 1); break;
        case 9: gguf_w_tensor(w, "t", T_F32, 2, (uint64_t[]){8, 0}, NULL); break;
        case 10: gguf_w_arr(w, "s", GGUF_T_STRING, NULL, 0); break;
        }
        gguf_w_u32(w, "after.error", 1); // ignored: the first error sticks
        buf_t b = {0};
        psv_error err = {0};
        psv_status st = gguf_writer_to_buf(w, &b, &err);
        CHECKF(st == cases[i].status, "%s: %s (%s)", cases[i].name, psv_status_name(st), err.message);
        CHECKF(strstr(err.message, cases[i].msg) != NULL, "%s: '%s' lacks '%s'", cases[i].name, err.message,
               cases[i].msg);
        buf_free(&b);
        gguf_writer_free(w);
    }
    gguf_writer_free(NULL);
    psv_error err = {0};
    CHECK(gguf_writer_to_buf(NULL, &(buf_t){0}, &err) == PSV_ERR_NOMEM);
}

// A file streamed to disk through a callback, in pieces, read back with gguf_open.
static void test_save_and_open(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/psv_test_gguf_%d.gguf", (int)getpid());
    uint64_t seed = 3;
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "test");
    gguf_w_tensor_fn(w, "big", T_Q8_0, 2, (uint64_t[]){4096, 64}, fill_pattern, &seed); // 278528 bytes
    gguf_w_tensor(w, "small", T_F32, 1, (uint64_t[]){3}, (float[]){1, 2, 3});
    psv_error err = {0};
    CHECKF(gguf_writer_save(w, path, &err) == PSV_OK, "%s", err.message);
    gguf_writer_free(w);
    gguf_file *f = NULL;
    CHECKF(gguf_open(path, &f, &err) == PSV_OK, "%s", err.message);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "big");
        CHECK(t && t->size == 4096 / 32 * 34 * 64 && t->data[t->size - 1] == (uint8_t)((t->size - 1) * 7 + seed));
        t = gguf_find_tensor(f, "small");
        CHECK(t && ((const float *)t->data)[2] == 3.0f); // mmap'd base: data is aligned
        CHECK(f->map.size == f->size);
    }
    gguf_close(f);
    remove(path);

    psv_error e2 = {0};
    CHECK(gguf_open("/nonexistent/x.gguf", &f, &e2) == PSV_ERR_IO && f == NULL);
    CHECK(strstr(e2.message, "/nonexistent/x.gguf") != NULL);

    // Parse errors from gguf_open name the file.
    FILE *fp = fopen(path, "wb");
    if (fp) {
        static const char bytes[] = "GGUF\4\0\0\0 garbage garbage garbage";
        fwrite(bytes, 1, sizeof bytes - 1, fp);
        fclose(fp);
        psv_error e3 = {0};
        CHECK(gguf_open(path, &f, &e3) == PSV_ERR_UNSUPPORTED);
        CHECKF(strncmp(e3.message, path, strlen(path)) == 0 && strstr(e3.message, ": gguf: unsupported version"),
               "%s", e3.message);
        remove(path);
    }
}

// ---- shared models and vocabularies ----

typedef struct {
    const char *file;
    const char *arch;
    uint64_t n_tensors;
    const char *tensor; // a tensor and its type (NULL: none)
    uint32_t type;
    const char *absent; // a tensor that must not exist
    uint64_t n_vocab;
} shared_case;

static const shared_case shared_cases[] = {
    {"reference/models/llama-spm-q4km.gguf", "llama", 30, "token_embd.weight", T_Q4_K, NULL, 32000},
    {"reference/models/llama-spm-q40.gguf", "llama", 30, "token_embd.weight", T_Q8_0, NULL, 32000},
    {"reference/models/phi3-q5km.gguf", "phi3", 23, "token_embd.weight", T_Q5_0, NULL, 32064},
    {"reference/models/qwen2-q3km.gguf", "qwen2", 27, "token_embd.weight", T_Q2_K, NULL, 50257},
    {"reference/models/phi4mini-q4km.gguf", "phi3", 16, "rope_factors_long.weight", T_F32, "output.weight", 50257},
    {"reference/models/phi2-f16.gguf", "phi2", 25, "token_embd.weight", T_BF16, NULL, 50257},
    {"conformance/tokenizer/ggml-vocab-llama-spm.gguf", "llama", 0, NULL, 0, NULL, 32000},
    {"conformance/tokenizer/ggml-vocab-gpt-2.gguf", "gpt2", 0, NULL, 0, NULL, 50257},
    {"conformance/tokenizer/ggml-vocab-phi-3.gguf", "phi3", 0, NULL, 0, NULL, 32064},
    {"conformance/tokenizer/ggml-vocab-deepseek-llm.gguf", "llama", 0, NULL, 0, NULL, 102400},
    {"conformance/tokenizer/ggml-vocab-deepseek-coder.gguf", "llama", 0, NULL, 0, NULL, 32256},
    {"conformance/tokenizer/ggml-vocab-falcon.gguf", "falcon", 0, NULL, 0, NULL, 65024},
    {"conformance/tokenizer/ggml-vocab-mpt.gguf", "mpt", 0, NULL, 0, NULL, 50432},
    {"conformance/tokenizer/ggml-vocab-refact.gguf", "refact", 0, NULL, 0, NULL, 49216},
    {"conformance/tokenizer/ggml-vocab-starcoder.gguf", "starcoder2", 0, NULL, 0, NULL, 49152},
    {"conformance/tokenizer/ggml-vocab-gpt-2-pre-gpt-4o.gguf", "gpt2", 0, NULL, 0, NULL, 50257},
    {"conformance/tokenizer/ggml-vocab-gpt-2-pre-llama-bpe.gguf", "gpt2", 0, NULL, 0, NULL, 50257},
    {"conformance/tokenizer/ggml-vocab-gpt-2-pre-qwen2.gguf", "gpt2", 0, NULL, 0, NULL, 50257},
};

static void test_shared(void) {
    if (!t_shared_dir()) {
        SKIP("shared models and vocabularies: ../shared is absent (set PSV_SHARED)");
        return;
    }
    for (size_t i = 0; i < PSV_ARRAY_LEN(shared_cases); i++) {
        const shared_case *c = &shared_cases[i];
        const char *path = t_shared_path(c->file);
        gguf_file *f = NULL;
        psv_error err = {0};
        psv_status st = gguf_open(path, &f, &err);
        CHECKF(st == PSV_OK, "%s: %s", c->file, err.message);
        if (st) continue;
        str_t arch = {0};
        CHECKF(gguf_get_str(f, "general.architecture", &arch) && str_eq_c(arch, c->arch), "%s: arch", c->file);
        CHECKF(f->n_tensors == c->n_tensors, "%s: %" PRIu64 " tensors", c->file, f->n_tensors);
        const gguf_kv *toks = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING);
        CHECKF(toks && toks->arr_n == c->n_vocab, "%s: vocabulary size", c->file);
        if (c->tensor) {
            const gguf_tensor *t = gguf_find_tensor(f, c->tensor);
            CHECKF(t && t->type == c->type, "%s: %s type", c->file, c->tensor);
        }
        if (c->absent) CHECKF(!gguf_find_tensor(f, c->absent), "%s: %s should be absent", c->file, c->absent);
        uint64_t sum = 0;
        for (uint64_t k = 0; k < f->n_tensors; k++) sum += f->tensors[k].size;
        CHECK(sum == f->tensor_bytes && (f->n_tensors == 0 || f->data_offset + sum <= f->size));
        gguf_close(f);
    }

    // Known facts from reference/README.md.
    gguf_file *f = NULL;
    psv_error err = {0};
    if (gguf_open(t_shared_path("reference/models/llama-spm-q4km.gguf"), &f, &err) == PSV_OK) {
        uint32_t u = 0;
        float eps = 0;
        bool add_bos = false;
        CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 256);
        CHECK(gguf_get_u32(f, "llama.block_count", &u) && u == 3);
        CHECK(gguf_get_u32(f, "llama.attention.head_count", &u) && u == 8);
        CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) && u == 2);
        CHECK(gguf_get_u32(f, "llama.feed_forward_length", &u) && u == 768);
        CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps) && eps > 0 && eps < 1e-3f);
        CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos);
        const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
        CHECK(t && t->n_dims == 2 && t->ne[0] == 256 && t->ne[1] == 32000);
        t = gguf_find_tensor(f, "output.weight");
        CHECK(t && t->type == T_Q6_K);
        const gguf_kv *scores = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32);
        const gguf_kv *types = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32);
        CHECK(scores && scores->arr_n == 32000 && types && types->arr_n == 32000);
        CHECK(types && gguf_arr_int(types, 0) == 2); // <unk> is UNKNOWN (2)
        const gguf_kv *toks = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING);
        CHECK(toks && str_eq_c(gguf_arr_str(toks, 1), "<s>") && str_eq_c(gguf_arr_str(toks, 2), "</s>"));
        gguf_close(f);
    } else {
        CHECKF(0, "%s", err.message);
    }
    err_clear(&err);
    if (gguf_open(t_shared_path("reference/models/qwen2-q3km.gguf"), &f, &err) == PSV_OK) {
        CHECK(gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL);
        const gguf_tensor *t = gguf_find_tensor(f, "output.weight");
        CHECK(t && t->type == T_Q6_K);
        CHECK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING) != NULL);
        gguf_close(f);
    } else {
        CHECKF(0, "%s", err.message);
    }
}

int main(void) {
    test_bad_files();
    test_round_trip();
    test_writer_errors();
    test_save_and_open();
    test_shared();
    return t_finish();
}
