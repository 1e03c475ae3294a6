/* libFuzzer target for the decoders of ps-server/store: row files (checkpoint parts and table
 * exports) and checkpoint manifests. Input byte 0 picks the target, the rest is the file.
 *   0: ps_rowfile_read on the bytes, every callback touching all it is given
 *   1: ps_table_import of the bytes into a fresh catalog
 *   2: the bytes as MANIFEST.json of checkpoint 1, sealed (pc_fs_seal) unless the last byte is
 *      odd (with a valid row file beside it from the seed), then ps_ckpt_list and
 *      ps_ckpt_restore
 * Whatever the input: no crash, no leak, no out-of-bounds access (ASan), an error code or a
 * consistent table. Build and short run: tests/CMakeLists.txt (label fuzz); longer run:
 *   build/tests/fuzz_store -max_total_time=600 build/tests/fuzz-corpus
 */
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pc_fs.h"
#include "pc_log.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "ps_rowfile.h"

#include "fuzz_seed_table.h"

static char g_dir[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static int write_file(const char *path, const uint8_t *d, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = n ? write(fd, d, n) : 0;
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

static volatile float g_sink;

static int touch_keys(void *ctx, const uint64_t *keys, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        g_sink += (float)(keys[i] & 1);
    return 0;
}

static int touch_rows(void *ctx, size_t n, const uint64_t *keys, const float *w, const float *s,
                      const uint16_t *ticks, const uint8_t *freqs) {
    const ps_rowfile_meta_t *m = ctx;
    for (size_t i = 0; i < n; i++) {
        g_sink += (float)(keys[i] & 1) + (float)ticks[i] + freqs[i];
        for (uint32_t e = 0; e < m->dim; e++)
            g_sink += w[i * m->dim + e];
        for (uint32_t e = 0; s && e < m->state_len; e++)
            g_sink += s[i * m->state_len + e];
    }
    return 0;
}

/* A valid row file of table "seed" (the one the seed manifest names), made once. */
static char g_rows[300];

static void cleanup(void) {
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pc_log_init(fopen("/dev/null", "w"), PC_LOG_ERROR, "fuzz"); /* errors are expected here */
    snprintf(g_dir, sizeof g_dir, "%s/ember-fuzz-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir))
        abort();
    atexit(cleanup);
    ps_catalog_t *cat;
    if (ps_catalog_create(&cat))
        abort();
    ps_table_t *t = fuzz_seed_table(cat);
    snprintf(g_rows, sizeof g_rows, "%s/seed.rows", g_dir);
    if (ps_table_export(t, NULL, g_rows, true))
        abort();
    ps_catalog_destroy(cat);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const uint8_t target = data[0] % 3;
    data++;
    size--;
    char path[512];
    if (target == 0 || target == 1) {
        snprintf(path, sizeof path, "%s/in.rows", g_dir);
        if (write_file(path, data, size))
            return 0;
        if (target == 0) {
            ps_rowfile_meta_t meta;
            ps_rowfile_read(path, &meta, touch_keys, touch_rows, &meta);
        } else {
            ps_catalog_t *cat;
            if (ps_catalog_create(&cat))
                abort();
            ps_table_import(cat, path, NULL);
            ps_catalog_destroy(cat);
        }
        unlink(path);
        return 0;
    }
    /* target 2: a checkpoint directory whose manifest is the input */
    char ck[400];
    snprintf(ck, sizeof ck, "%s/ck", g_dir);
    mkdir(ck, 0755);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000001", ck);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000001/MANIFEST.json", ck);
    char rows[512];
    snprintf(rows, sizeof rows, "%s/ckpt-00000000000000000001/t-seed.rows", ck);
    /* sealed as the writer seals (else nearly every mutation stops at the seal, before the
     * JSON is read), unless the input ends in an odd byte: as it is (the seal's own check) */
    const bool as_is = size && (data[size - 1] & 1);
    uint8_t *text = malloc(size + PC_FS_SEAL_LEN + 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    const size_t len = as_is ? size : pc_fs_seal((char *)text, size, size + PC_FS_SEAL_LEN + 1);
    const int wrc = write_file(path, text, len);
    free(text);
    if (wrc == 0 && link(g_rows, rows) == 0) {
        ps_ckpt_entry_t e[4];
        size_t n;
        ps_ckpt_list(ck, e, 4, &n);
        ps_catalog_t *cat;
        ps_ckpt_t *c;
        ps_ckpt_opts_t o = {.dir = ck, .keep = 5, .full_every = 3};
        if (ps_catalog_create(&cat) || ps_ckpt_create(cat, &o, &c))
            abort();
        ps_ckpt_restore(c, 0, NULL);
        ps_ckpt_destroy(c);
        ps_catalog_destroy(cat);
    }
    nftw(ck, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
