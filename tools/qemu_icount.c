// tools/qemu_icount.c — a TCG plugin for qemu-user that counts the guest instructions a program
// executes and prints the count to stderr when it exits ("icount: N"). tools/llama_compare.py's
// `arm` command runs pensieve and llama.cpp under qemu-aarch64 with it, to compare the
// instructions each executes per token where there is no ARM machine to time them on.
//   cc -O2 -shared -fPIC tools/qemu_icount.c -o qemu_icount.so
//   qemu-aarch64 -plugin ./qemu_icount.so PROGRAM ARGS...
// Each translated block adds its instruction count to one counter when it runs (an inline add,
// no callback), so the count is exact and costs little; threads share the counter without
// atomics, so it is exact for one guest thread at a time (pensieve and llama-bench with -t 1).
// With the argument prof=FILE (`-plugin ./qemu_icount.so,prof=FILE`) it also writes each translated
// block's start address and the instructions it executed ("ADDR COUNT" in hex and decimal, one
// block a line), which tools/llama_compare.py's `arm --prof` sums by function.
// The declarations below are the few of qemu's plugin API (version 1, qemu 4.2 to 8.x) it uses,
// so that no qemu headers are needed.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr, uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);

#define EXPORT __attribute__((visibility("default")))
EXPORT int qemu_plugin_version = 1;

static uint64_t icount_total;

// prof=FILE: a counter for each translated block (a block translated again gets another), kept
// in a list to write at exit.
typedef struct icount_block {
    uint64_t addr, count;
    struct icount_block *next;
} icount_block;
static const char *icount_prof;
static icount_block *icount_blocks;
static int icount_lost; // blocks without a counter (out of memory): the profile would be short

static void icount_tb(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    const uint64_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &icount_total, n);
    icount_block *b = icount_prof ? calloc(1, sizeof *b) : NULL;
    icount_lost |= icount_prof && !b;
    if (b) {
        b->addr = qemu_plugin_tb_vaddr(tb), b->next = icount_blocks, icount_blocks = b;
        qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->count, n);
    }
}

static void icount_exit(qemu_plugin_id_t id, void *userdata) {
    (void)id, (void)userdata;
    fprintf(stderr, "icount: %llu\n", (unsigned long long)icount_total);
    FILE *f = icount_prof && !icount_lost ? fopen(icount_prof, "w") : NULL;
    if (icount_lost) fprintf(stderr, "qemu_icount: out of memory for the blocks' counters: no profile written\n");
    else if (icount_prof && !f) fprintf(stderr, "qemu_icount: cannot write %s\n", icount_prof);
    for (icount_block *b = icount_blocks; f && b; b = b->next)
        if (b->count) fprintf(f, "%llx %llu\n", (unsigned long long)b->addr, (unsigned long long)b->count);
    if (f) fclose(f);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info;
    if (argc > 1 || (argc == 1 && strncmp(argv[0], "prof=", 5) != 0)) {
        fprintf(stderr, "qemu_icount: takes no arguments but prof=FILE\n");
        return -1;
    }
    icount_prof = argc == 1 ? argv[0] + 5 : NULL;
    qemu_plugin_register_vcpu_tb_trans_cb(id, icount_tb);
    qemu_plugin_register_atexit_cb(id, icount_exit, NULL);
    return 0;
}
