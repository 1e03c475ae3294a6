/* Checkpoints: bit-exact round trips for every optimizer, incremental chains with tombstones,
 * consistency while pushes continue, retention, unpublished and corrupted checkpoints,
 * export/import and bad files; stream positions in manifests (ps_ckpt_tables: a restore plus the
 * change log from log_position equals the live table; older manifests without them) and
 * read-only checkpointers. */
#include "table_check.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hash.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"

static ps_table_t *get(ps_catalog_t *cat, const char *name) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, name, &t), 0);
    ps_catalog_release(cat, t);
    return t;
}

static void test_roundtrip_every_optimizer(void **state) {
    (void)state;
    const char *specs[] = {
        "name=sgd,dim=7,optimizer=sgd",
        "name=ada,dim=16,optimizer=adagrad,init=normal",
        "name=row,dim=9,optimizer=rowwise_adagrad",
        "name=adam,dim=12,optimizer=adam,shards=4",
        "name=ftrl,dim=5,optimizer=ftrl,l1=0.01,init=zeros",
    };
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "ckpt");
    ps_catalog_t *cat, *cat2;
    assert_int_equal(ps_catalog_create(&cat), 0);
    for (size_t i = 0; i < 5; i++) {
        ps_table_t *t = tc_add(cat, specs[i]);
        for (int k = 1; k <= 6; k++)
            tc_round(t, k);
        assert_int_equal(ps_table_advance_clock(t, 40 + (uint32_t)i), 0);
    }
    ps_ckpt_t *ck, *ck2;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 1};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    ps_ckpt_result_t r;
    assert_int_equal(ps_ckpt_write(ck, &r), 0);
    assert_int_equal(r.id, 1);
    assert_false(r.incremental);
    assert_true(r.rows > 5 * 1000);

    assert_int_equal(ps_catalog_create(&cat2), 0);
    assert_int_equal(ps_ckpt_create(cat2, &o, &ck2), 0);
    uint64_t got;
    assert_int_equal(ps_ckpt_restore(ck2, 0, &got), 0);
    assert_int_equal(got, 1);
    char names[8][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(cat2, names, 8), 5);
    for (size_t i = 0; i < 5; i++) {
        ps_table_t *a = get(cat, names[i]), *b = get(cat2, names[i]);
        tc_assert_equal(a, b);
        assert_int_equal(ps_table_version(a), ps_table_version(b));
        assert_int_equal(ps_table_clock(a), ps_table_clock(b)); /* the cut advanced both */
        assert_memory_equal(ps_table_config(a), ps_table_config(b), sizeof(ps_table_config_t));
    }
    ps_ckpt_destroy(ck);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(cat);
    ps_catalog_destroy(cat2);
    tc_rmdir(dir);
}

/* Reference for "the table after rounds 1..k with a checkpoint after each": replay. */
static ps_table_t *replay(const char *spec, int k) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, spec, NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    for (int j = 1; j <= k; j++) {
        tc_round(t, j);
        assert_int_equal(ps_table_advance_clock(t, ps_table_clock(t) + 1), 0); /* the cut */
    }
    return t;
}

static void test_incremental_chain(void **state) {
    (void)state;
    const char *spec = "name=chain,dim=8,optimizer=adam,shards=4";
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "chain");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, spec);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 100, .full_every = 4};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    uint64_t full_bytes = 0, inc_bytes = 0;
    for (int k = 1; k <= 9; k++) {
        tc_round(t, k);
        ps_ckpt_result_t r;
        assert_int_equal(ps_ckpt_write(ck, &r), 0);
        assert_int_equal(r.id, (uint64_t)k);
        assert_int_equal(r.incremental, (k - 1) % 4 != 0); /* 1, 5, 9 full */
        if (r.incremental) {
            assert_int_equal(r.parent, (uint64_t)k - 1);
            inc_bytes += r.bytes;
            if (k % 3 == 0)
                assert_true(r.tombstones > 0);
        } else {
            full_bytes += r.bytes;
        }
    }
    assert_true(inc_bytes / 6 < full_bytes / 3); /* increments hold only changed rows */
    /* Every checkpoint restores to exactly the state after its round. */
    for (int k = 1; k <= 9; k++) {
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        assert_int_equal(ps_ckpt_restore(ck2, (uint64_t)k, NULL), 0);
        ps_table_t *ref = replay(spec, k);
        tc_assert_equal(get(c2, "chain"), ref);
        ps_table_destroy(ref);
        /* A restored chain continues: its next checkpoint is an increment of k. */
        if (k == 6) {
            tc_round(get(c2, "chain"), 7);
            ps_ckpt_result_t r;
            assert_int_equal(ps_ckpt_write(ck2, &r), 0);
            assert_true(r.incremental);
            assert_int_equal(r.parent, 6);
            ps_catalog_t *c3;
            ps_ckpt_t *ck3;
            assert_int_equal(ps_catalog_create(&c3), 0);
            assert_int_equal(ps_ckpt_create(c3, &o, &ck3), 0);
            assert_int_equal(ps_ckpt_restore(ck3, r.id, NULL), 0);
            ps_table_t *ref7 = replay(spec, 7);
            tc_assert_equal(get(c3, "chain"), ref7);
            ps_table_destroy(ref7);
            ps_ckpt_destroy(ck3);
            ps_catalog_destroy(c3);
        }
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
    }
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* Tables whose chains end at different checkpoints, restored in one walk of the chain: one made
 * after the chain began (its first entry full, with rows, in a later checkpoint), the others
 * since the chain's full checkpoint, each table at another place in each manifest; each
 * checkpoint restores every table exactly as it was when written, and a restore that runs out
 * of memory at any allocation fails with PC_ENOMEM and gives its scratch memory back. */
static void test_chains_of_unequal_length(void **state) {
    (void)state;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "chains");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    const char *names[] = {"zeta", "alpha", "mid"};
    ps_table_t *t[3] = {tc_add(cat, "name=zeta,dim=8,optimizer=adagrad"),
                        tc_add(cat, "name=alpha,dim=4,optimizer=sgd"), NULL};
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 100, .full_every = 8};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    for (int k = 1; k <= 6; k++) {
        if (k == 3) /* made mid-chain */
            t[2] = tc_add(cat, "name=mid,dim=8,optimizer=adam");
        for (int i = 0; i < 3; i++)
            if (t[i] && (k + i) % 2 == 1) /* every other checkpoint; mid from its first */
                tc_round(t[i], k);
        ps_ckpt_result_t r;
        assert_int_equal(ps_ckpt_write(ck, &r), 0);
        assert_int_equal(r.incremental, k > 1);
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        assert_int_equal(ps_ckpt_restore(ck2, r.id, NULL), 0);
        char listed[4][PS_TABLE_NAME_MAX];
        assert_int_equal(ps_catalog_list(c2, listed, 4), k >= 3 ? 3 : 2);
        for (int i = 0; i < 3; i++)
            if (t[i])
                tc_assert_equal(get(c2, names[i]), t[i]);
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
    }
    for (long n = 0;; n++) { /* the chain of 6, every allocation of the restore failing once */
        const uint64_t scratch = pc_mem_used(PC_MEM_SCRATCH);
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        pc_mem_fail_after(n);
        const int rc = ps_ckpt_restore(ck2, 6, NULL);
        pc_mem_fail_after(-1);
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
        assert_true(pc_mem_used(PC_MEM_SCRATCH) == scratch); /* all of it went back */
        if (rc == 0)
            break;
        assert_int_equal(rc, PC_ENOMEM);
        assert_true(n < 100000);
    }
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* ---- consistency while pushes continue ------------------------------------------------- */

#define PUSHES_MAX 100000

typedef struct pusher {
    ps_table_t *t;
    atomic_int done, stop;
} pusher_t;

/* Call i: one push of 256 rows; every tenth call then erases 40 of them (rows move inside
 * their shard, across a running scan's cursor). */
static void push_call(ps_table_t *t, int i, bool with_erase) {
    enum { N = 256, D = 16 };
    uint64_t keys[N];
    static _Thread_local float g[N * D];
    uint64_t rng = 77 + (uint64_t)i;
    for (int j = 0; j < N; j++) {
        keys[j] = tu_rand(&rng) % 20000;
        for (int e = 0; e < D; e++)
            g[j * D + e] = tu_gauss(&rng);
    }
    assert_int_equal(ps_table_push(t, keys, N, g, N * D, NULL), 0);
    if (with_erase && i % 10 == 9)
        assert_int_equal(ps_table_erase(t, keys, 40, NULL), 0);
}

static void *push_loop(void *arg) { /* until told to stop: every cut lands mid-stream */
    pusher_t *p = arg;
    for (int i = 0; i < PUSHES_MAX && !atomic_load(&p->stop); i++) {
        push_call(p->t, i, true);
        atomic_store(&p->done, i + 1);
    }
    return NULL;
}

static void test_consistent_under_pushes(void **state) {
    (void)state;
    /* 2 shards of ~10k rows: each is written in several chunks, with pushes and erases
     * landing between them */
    const char *spec = "name=live,dim=16,optimizer=adam,shards=2";
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "live");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, spec);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 5, .full_every = 1};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    pusher_t p = {.t = t};
    pthread_t th;
    pthread_create(&th, NULL, push_loop, &p);
    uint64_t ids[3];
    for (int c = 0; c < 3; c++) { /* checkpoints land at different moments of the pushes */
        while (atomic_load(&p.done) < 150 * (c + 1))
            usleep(100);
        ps_ckpt_result_t r;
        assert_int_equal(ps_ckpt_write(ck, &r), 0);
        ids[c] = r.id;
    }
    while (atomic_load(&p.done) < 150 * 3 + 150) /* keep pushing a while after the last cut */
        usleep(100);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    const int pushed = atomic_load(&p.done);
    ps_catalog_t *c2[3];
    ps_ckpt_t *ck2[3];
    uint64_t v[3];
    for (int c = 0; c < 3; c++) {
        assert_int_equal(ps_catalog_create(&c2[c]), 0);
        assert_int_equal(ps_ckpt_create(c2[c], &o, &ck2[c]), 0);
        assert_int_equal(ps_ckpt_restore(ck2[c], ids[c], NULL), 0);
        v[c] = ps_table_version(get(c2[c], "live"));
        assert_true(v[c] >= 150u * (c + 1) && v[c] < (uint64_t)pushed);
    }
    for (int c = 0; c < 3; c++) {
        /* Exactly the first v[c] push calls, whole (no torn rows, no mixed epochs), with the
         * clock advanced by each earlier cut at the same point of the sequence. The erase of
         * call v[c] - 1 may fall on either side of the cut: one of the two states it is. */
        ps_table_t *ref = NULL;
        for (int last_erase = 1; last_erase >= 0; last_erase--) {
            ps_table_config_t cfg;
            ps_table_config_defaults(&cfg);
            assert_int_equal(ps_table_config_parse(&cfg, spec, NULL, 0), 0);
            assert_int_equal(ps_table_create(&cfg, &ref), 0);
            int cut = 0;
            for (uint64_t i = 0; i <= v[c]; i++) {
                while (cut <= c && v[cut] == i) {
                    assert_int_equal(ps_table_advance_clock(ref, ps_table_clock(ref) + 1), 0);
                    cut++;
                }
                if (i < v[c])
                    push_call(ref, (int)i, i + 1 < v[c] || last_erase);
            }
            if (ps_table_count(ref) == ps_table_count(get(c2[c], "live")) || !last_erase)
                break;
            ps_table_destroy(ref);
        }
        tc_assert_equal(get(c2[c], "live"), ref);
        print_message("checkpoint %d: cut after push %llu of %d, restored bit-exact\n", c,
                      (unsigned long long)v[c], pushed);
        ps_table_destroy(ref);
        ps_ckpt_destroy(ck2[c]);
        ps_catalog_destroy(c2[c]);
    }
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* ---- retention, leftovers, corruption ------------------------------------------------- */

static void flip_byte(const char *path, off_t off) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

/* Checkpoint id's manifest under dir. */
static void manifest_path(const char *dir, int id, char *path, size_t cap) {
    snprintf(path, cap, "%s/ckpt-%020d/MANIFEST.json", dir, id);
}

/* A manifest's text without its seal line (the writer's last line, "xxh3 " and 16 hex digits):
 * malloc'ed, NUL-terminated, *len its length. */
static char *manifest_text(const char *path, size_t *len) {
    char *text;
    assert_int_equal(pc_fs_read_all(path, 1 << 20, &text, len), 0);
    assert_true(*len > 22 && strncmp(text + *len - 22, "xxh3 ", 5) == 0);
    *len -= 22;
    text[*len] = '\0';
    return text;
}

/* Write text as the manifest at path, sealed as the writer seals (or not: an older manifest). */
static void manifest_put(const char *path, const char *text, size_t len, bool seal) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    if (seal)
        fprintf(f, "xxh3 %016" PRIx64 "\n", pc_hash64(text, len, 0));
    fclose(f);
}

/* A manifest is sealed (an XXH3 of its text on its last line): a flipped byte is refused
 * whatever it changed. Here the parent of an incremental checkpoint: 2's parent 1 read as 0
 * (none) would restore 2's increment alone, without the rows only 1 holds. A seal line taken
 * away (the format asks for one) is refused too. */
static void test_manifest_seal(void **state) {
    (void)state;
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "mseal");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, "name=k,dim=4,optimizer=sgd");
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 5, .full_every = 4};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    for (int k = 1; k <= 2; k++) {
        tc_round(t, k);
        assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    }
    manifest_path(dir, 2, path, sizeof path);
    size_t len;
    char *text = manifest_text(path, &len), *seal = NULL;
    size_t all;
    assert_int_equal(pc_fs_read_all(path, 1 << 20, &seal, &all), 0);
    char *parent = strstr(text, "\"parent\":\t\"1\"");
    assert_non_null(parent);
    parent[11] = '0';
    FILE *f = fopen(path, "w"); /* the flipped text under its old seal */
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fwrite(seal + len, 1, all - len, f), all - len);
    fclose(f);
    ps_ckpt_table_info_t ti[2];
    size_t n;
    assert_int_equal(ps_ckpt_tables(dir, 2, ti, 2, &n), PC_ECORRUPT);
    ps_catalog_t *c2;
    ps_ckpt_t *ck2;
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
    assert_int_equal(ps_ckpt_restore(ck2, 2, NULL), PC_ECORRUPT);
    parent[11] = '1'; /* the right text, its seal line gone */
    manifest_put(path, text, len, false);
    assert_int_equal(ps_ckpt_restore(ck2, 2, NULL), PC_ECORRUPT);
    manifest_put(path, text, len, true); /* sealed again: restorable */
    assert_int_equal(ps_ckpt_restore(ck2, 2, NULL), 0);
    tc_assert_equal(get(c2, "k"), t);
    free(text);
    free(seal);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* A manifest whose table settings changed (a digit of lr flipped: still JSON, still a spec), and
 * sealed again, is refused: the table would come back with other settings, silently (the row
 * file's header, which is checksummed too, carries the settings). */
static void test_manifest_settings(void **state) {
    (void)state;
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "mcfg");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    tc_round(tc_add(cat, "name=k,dim=4,optimizer=sgd,lr=0.25"), 1);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 2, .full_every = 1};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    manifest_path(dir, 1, path, sizeof path);
    size_t len;
    char *text = manifest_text(path, &len);
    char *lr = strstr(text, "lr=0.25");
    assert_non_null(lr);
    lr[5] = '3'; /* lr=0.35 */
    manifest_put(path, text, len, true);
    free(text);
    ps_catalog_t *c2;
    ps_ckpt_t *ck2;
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
    assert_int_equal(ps_ckpt_restore(ck2, 1, NULL), PC_ECORRUPT);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* cJSON's allocations (not counted by pc_alloc, so test_oom's injection cannot reach them): the
 * k-th one fails while a checkpoint is written (one failure, the others succeed), for every k
 * until one write meets no failure: each write either fails or publishes a manifest that reads
 * back. (Before, a table entry missing a field was published and the write reported done: every
 * reader refused that manifest, and every later incremental chained on it.) */
static atomic_long g_json_left = -1; /* allocations before the one that fails; -1: none fails,
                                      * -2: it has failed */

static void *json_malloc(size_t n) {
    long left = atomic_load(&g_json_left);
    while (left >= 0 &&
           !atomic_compare_exchange_weak(&g_json_left, &left, left > 0 ? left - 1 : -2))
        ;
    return left == 0 ? NULL : malloc(n);
}

static void test_manifest_json_oom(void **state) {
    (void)state;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "mjson");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    tc_round(tc_add(cat, "name=a,dim=4,optimizer=adagrad"), 1);
    tc_round(tc_add(cat, "name=b,dim=8,optimizer=sgd"), 2);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 2};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    cJSON_Hooks hooks = {.malloc_fn = json_malloc, .free_fn = free};
    cJSON_InitHooks(&hooks);
    int failed = 0, published = 0;
    bool done = false;
    for (long k = 0; k < 2000 && !done; k++) {
        ps_ckpt_result_t r;
        atomic_store(&g_json_left, k);
        const int rc = ps_ckpt_write(ck, &r);
        done = atomic_load(&g_json_left) != -2; /* no allocation failed */
        atomic_store(&g_json_left, -1);
        if (rc) {
            failed++;
            continue;
        }
        published++;
        ps_ckpt_table_info_t ti[2];
        size_t n = 0;
        assert_int_equal(ps_ckpt_tables(dir, r.id, ti, 2, &n), 0); /* it reads back */
        assert_int_equal(n, 2);
    }
    cJSON_InitHooks(NULL);
    print_message("cJSON allocation failures: %d writes failed, %d published\n", failed, published);
    assert_true(done && failed > 0);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

static void test_retention_and_damage(void **state) {
    (void)state;
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "keep");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, "name=k,dim=4,optimizer=sgd");
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 2, .full_every = 3};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    for (int k = 1; k <= 7; k++) {
        tc_round(t, k);
        assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    }
    /* keep 2 restore points (6, 7); 7 is a full one (1, 4, 7 full), 6 needs 5 and 4 */
    ps_ckpt_entry_t e[16];
    size_t n;
    assert_int_equal(ps_ckpt_list(dir, e, 16, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(e[0].id, 4);
    assert_int_equal(e[3].id, 7);
    assert_false(e[3].incremental);
    assert_true(e[2].incremental);

    /* A crashed, unpublished checkpoint is never chosen... */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000008.tmp", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    ps_catalog_t *c2;
    ps_ckpt_t *ck2;
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0); /* ...and is cleaned up */
    struct stat st;
    assert_int_equal(stat(path, &st), -1);
    uint64_t got;
    assert_int_equal(ps_ckpt_restore(ck2, 0, &got), 0);
    assert_int_equal(got, 7);
    ps_table_t *ref = replay("name=k,dim=4,optimizer=sgd", 7);
    tc_assert_equal(get(c2, "k"), ref);
    ps_table_destroy(ref);

    /* A damaged newest checkpoint: named restore refuses, "newest" falls back to 6. */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000007/t-k.rows", dir);
    flip_byte(path, 200);
    ps_catalog_t *c3;
    ps_ckpt_t *ck3;
    assert_int_equal(ps_catalog_create(&c3), 0);
    assert_int_equal(ps_ckpt_create(c3, &o, &ck3), 0);
    assert_int_equal(ps_ckpt_restore(ck3, 7, NULL), PC_ECORRUPT);
    assert_int_equal(ps_ckpt_restore(ck3, 0, &got), 0);
    assert_int_equal(got, 6);
    ref = replay("name=k,dim=4,optimizer=sgd", 6);
    tc_assert_equal(get(c3, "k"), ref);
    ps_table_destroy(ref);
    /* A truncated file in the chain of 6: nothing restores, no table was replaced, and "newest"
     * says the checkpoints are damaged, not that there are none (a server would start empty). */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000004/t-k.rows", dir);
    assert_int_equal(truncate(path, 100), 0);
    ps_catalog_t *c4;
    ps_ckpt_t *ck4;
    assert_int_equal(ps_catalog_create(&c4), 0);
    assert_int_equal(ps_ckpt_create(c4, &o, &ck4), 0);
    assert_int_equal(ps_ckpt_restore(ck4, 6, NULL), PC_ECORRUPT);
    assert_int_equal(ps_ckpt_restore(ck4, 0, NULL), PC_ECORRUPT);
    char names[2][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(c4, names, 2), 0);
    /* A manifest that is not JSON. */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000007/MANIFEST.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": 1, \"id\": ", f);
    fclose(f);
    assert_int_equal(ps_ckpt_restore(ck4, 7, NULL), PC_ECORRUPT);
    /* Files missing instead (a row file of 7, the manifest of 4 in 6's chain): still damaged
     * checkpoints, not none (PC_ENOTFOUND before: a server started empty over them) */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000007/t-k.rows", dir);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000007/MANIFEST.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000004/MANIFEST.json", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ps_ckpt_restore(ck4, 0, NULL), PC_ECORRUPT);
    ps_ckpt_destroy(ck4);
    ps_catalog_destroy(c4);
    ps_ckpt_destroy(ck3);
    ps_catalog_destroy(c3);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* A rollback: ps_ckpt_rollback to checkpoint 2 of 4 abandons 3 and 4 (renamed, not published: a
 * restart that restores the newest takes 2, it took 4, the abandoned run's rows); the next
 * checkpoint is 5 (ids are never given twice), follows 2's chain, and removes the abandoned ones. A
 * read-only checkpointer refuses, and a plain restore (a look at an old one) abandons nothing. */
static void test_rollback_abandons_newer(void **state) {
    (void)state;
    const char *spec = "name=r,dim=4,optimizer=adagrad";
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "rollback");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, spec);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 8, .full_every = 8};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    for (int k = 1; k <= 4; k++) {
        tc_round(t, k);
        assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    }
    ps_ckpt_t *ro; /* a serving replica's view first: it changes nothing */
    ps_catalog_t *rcat;
    ps_ckpt_opts_t ro_opts = {.dir = dir, .keep = 8, .full_every = 8, .read_only = true};
    assert_int_equal(ps_catalog_create(&rcat), 0);
    assert_int_equal(ps_ckpt_create(rcat, &ro_opts, &ro), 0);
    assert_int_equal(ps_ckpt_restore(ro, 2, NULL), 0);
    assert_int_equal(ps_ckpt_rollback(ro, 2, NULL), PC_ESTATE);
    assert_int_equal(ps_ckpt_restore(ck, 2, NULL), 0); /* a restore alone (a look) neither */
    ps_ckpt_entry_t e[8];
    size_t n;
    assert_int_equal(ps_ckpt_list(dir, e, 8, &n), 0);
    assert_int_equal(n, 4);

    uint64_t got;
    assert_int_equal(ps_ckpt_rollback(ck, 2, &got), 0);
    assert_int_equal(got, 2);
    assert_int_equal(ps_ckpt_list(dir, e, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(e[1].id, 2);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000004.abandoned/MANIFEST.json", dir);
    assert_int_equal(access(path, F_OK), 0); /* kept until the next checkpoint */

    ps_catalog_t *c2; /* a restart: the newest is the restored one */
    ps_ckpt_t *ck2;
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
    assert_int_equal(ps_ckpt_restore(ck2, 0, &got), 0);
    assert_int_equal(got, 2);
    ps_table_t *ref = replay(spec, 2);
    tc_assert_equal(get(c2, "r"), ref);
    ps_table_destroy(ref);

    tc_round(get(cat, "r"), 3); /* the new run's round 3, checkpointed */
    ps_ckpt_result_t res;
    assert_int_equal(ps_ckpt_write(ck, &res), 0);
    assert_int_equal(res.id, 5);
    assert_true(res.incremental);
    assert_int_equal(res.parent, 2);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000003.abandoned", dir);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(ps_ckpt_restore(ck2, 0, &got), 0);
    assert_int_equal(got, 5);
    ref = replay(spec, 3);
    tc_assert_equal(get(c2, "r"), ref);
    ps_table_destroy(ref);

    /* A newer checkpoint that cannot be abandoned (its .abandoned name taken by a non-empty
     * directory): the rollback restores, but says it failed (it answered 0, and a restart
     * restoring the newest took the abandoned run's checkpoint 6); once possible, again: 0. */
    assert_int_equal(ps_ckpt_write(ck, &res), 0);
    assert_int_equal(res.id, 6);
    char blocker[600];
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000006.abandoned", dir);
    snprintf(blocker, sizeof blocker, "%s/x", path);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(mkdir(blocker, 0755), 0);
    assert_int_equal(ps_ckpt_rollback(ck, 5, &got), PC_EIO);
    assert_int_equal(got, 5);
    assert_int_equal(ps_ckpt_list(dir, e, 8, &n), 0);
    assert_int_equal(e[n - 1].id, 6); /* still published */
    assert_int_equal(rmdir(blocker), 0);
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(ps_ckpt_rollback(ck, 5, &got), 0);
    assert_int_equal(ps_ckpt_list(dir, e, 8, &n), 0);
    assert_int_equal(e[n - 1].id, 5);
    ps_ckpt_destroy(ro);
    ps_catalog_destroy(rcat);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

static void test_export_import(void **state) {
    (void)state;
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "export");
    snprintf(path, sizeof path, "%s/model.rows", dir);
    ps_catalog_t *cat, *c2;
    assert_int_equal(ps_catalog_create(&cat), 0);
    assert_int_equal(ps_catalog_create(&c2), 0);
    ps_table_t *t = tc_add(cat, "name=emb,dim=10,optimizer=adagrad");
    for (int k = 1; k <= 4; k++)
        tc_round(t, k);
    assert_int_equal(ps_table_export(t, NULL, path, true), 0);
    assert_int_equal(ps_table_import(c2, path, NULL), 0);
    tc_assert_equal(t, get(c2, "emb"));
    assert_int_equal(ps_table_import(c2, path, NULL), PC_EEXIST);
    /* without optimizer state, under another name: same weights, fresh state */
    assert_int_equal(ps_table_export(t, NULL, path, false), 0);
    assert_int_equal(ps_table_import(c2, path, "serving"), 0);
    ps_table_t *s = get(c2, "serving");
    assert_int_equal(ps_table_count(s), ps_table_count(t));
    uint64_t k = 2000 * 0x9E3779B97F4A7C15ULL;
    float a[10], b[10];
    uint8_t fa, fb;
    assert_int_equal(ps_table_lookup(t, &k, 1, a, 10, &fa), 0);
    assert_int_equal(ps_table_lookup(s, &k, 1, b, 10, &fb), 0);
    assert_int_equal(fa, fb);
    assert_memory_equal(a, b, sizeof a);
    /* damaged and truncated files are refused, nothing is added */
    flip_byte(path, 300);
    assert_int_equal(ps_table_import(c2, path, "bad1"), PC_ECORRUPT);
    assert_int_equal(ps_table_export(t, NULL, path, true), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 5), 0);
    assert_int_equal(ps_table_import(c2, path, "bad2"), PC_ECORRUPT);
    assert_int_equal(truncate(path, 10), 0);
    assert_int_equal(ps_table_import(c2, path, "bad3"), PC_ECORRUPT);
    char names[8][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(c2, names, 8), 2);
    snprintf(path, sizeof path, "%s/missing.rows", dir);
    assert_int_equal(ps_table_import(c2, path, NULL), PC_ENOTFOUND);
    /* A file whose reads fail (here a directory: it opens, every read fails) is an I/O error,
     * not damage: a restore stops on it rather than going back to an older checkpoint. Its
     * entries give it a size past the header and footer on any file system. */
    snprintf(path, sizeof path, "%s/unreadable.rows", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    for (int i = 0; i < 8; i++) {
        char entry[600];
        snprintf(entry, sizeof entry, "%s/an-entry-with-a-long-name-%d", path, i);
        close(creat(entry, 0644));
    }
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size >= 80);
    assert_int_equal(ps_table_import(c2, path, "bad4"), PC_EIO);
    ps_catalog_destroy(cat);
    ps_catalog_destroy(c2);
    tc_rmdir(dir);
}

/* Row files whose size ends just below a 1 MiB buffer boundary (the footer must not overflow the
 * writer's buffer: ASan guards this), a manifest whose settings contradict its row file, and an
 * incremental part offered to import. */
static void test_regressions(void **state) {
    (void)state;
    char dir[256], path[512];
    tc_tmpdir(dir, sizeof dir, "regress");
    ps_catalog_t *cat, *c2;
    assert_int_equal(ps_catalog_create(&cat), 0);
    assert_int_equal(ps_catalog_create(&c2), 0);
    ps_table_t *t = tc_add(cat, "name=edge,dim=1,optimizer=sgd,init=zeros");
    char cfg[2048];
    size_t clen = ps_table_config_format(ps_table_config(t), cfg, sizeof cfg);
    const size_t header = 44 + clen, row = 12 + 4;
    const size_t n = ((1u << 20) - 1 - header) / row; /* rows end 1..16 bytes short of 1 MiB */
    uint64_t *keys = malloc(n * sizeof *keys);
    float *rows = malloc(n * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        keys[i] = i + 1;
    assert_int_equal(ps_table_pull(t, keys, n, rows, n), 0);
    snprintf(path, sizeof path, "%s/edge.rows", dir);
    assert_int_equal(ps_table_export(t, NULL, path, true), 0);
    assert_int_equal(ps_table_import(c2, path, NULL), 0);
    tc_assert_equal(t, get(c2, "edge"));
    free(keys);
    free(rows);

    /* manifest says dim=2, its row file holds dim-1 rows: refused before loading */
    char cdir[300];
    snprintf(cdir, sizeof cdir, "%s/ck", dir);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = cdir, .keep = 5, .full_every = 2};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    manifest_path(cdir, 1, path, sizeof path);
    size_t len;
    char *text = manifest_text(path, &len);
    char *dim = strstr(text, "dim=1,");
    assert_non_null(dim);
    dim[4] = '2';
    manifest_put(path, text, len, true); /* sealed again: the row file's header refuses it */
    free(text);
    ps_catalog_t *c3;
    ps_ckpt_t *ck3;
    assert_int_equal(ps_catalog_create(&c3), 0);
    assert_int_equal(ps_ckpt_create(c3, &o, &ck3), 0);
    assert_int_equal(ps_ckpt_restore(ck3, 1, NULL), PC_ECORRUPT);

    /* an incremental part is not a table */
    tc_round(t, 1);
    ps_ckpt_result_t r;
    assert_int_equal(ps_ckpt_write(ck, &r), 0);
    assert_true(r.incremental);
    snprintf(path, sizeof path, "%s/ckpt-%020llu/t-edge.rows", cdir, (unsigned long long)r.id);
    assert_int_equal(ps_table_import(c3, path, "part"), PC_EINVAL);
    char names[4][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(c3, names, 4), 0);
    ps_ckpt_destroy(ck3);
    ps_catalog_destroy(c3);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    ps_catalog_destroy(c2);
    tc_rmdir(dir);
}

/* Weights and keys of every row equal (metadata aside: a follower loads rows anew). */
static void assert_same_weights(const ps_table_t *a, const ps_table_t *b) {
    tc_rows_t x, y;
    tc_dump(a, &x);
    tc_dump(b, &y);
    assert_int_equal(x.n, y.n);
    assert_memory_equal(x.keys, y.keys, x.n * sizeof *x.keys);
    for (size_t i = 0; i < x.n; i++)
        assert_memory_equal(x.vals + i * x.width, y.vals + i * y.width, x.dim * sizeof(float));
    tc_free(&x);
    tc_free(&y);
}

/* A follower's step: the keys of `live`'s log from `from` to its head, each with its row as
 * live holds it now (or erased), applied to `copy`. */
static void apply_log(ps_table_t *live, uint64_t from, ps_table_t *copy) {
    ps_changelog_t *log = ps_table_changelog(live);
    const uint32_t dim = ps_table_dim(live);
    uint64_t keys[512];
    float row[64];
    uint8_t found;
    for (size_t n;; from += n) {
        assert_int_equal(ps_changelog_read(log, from, 512, keys, &n, NULL, NULL), 0);
        if (!n)
            break;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(ps_table_lookup(live, &keys[i], 1, row, dim, &found), 0);
            if (found)
                assert_int_equal(ps_table_load(copy, 1, &keys[i], row, NULL, NULL, NULL), 0);
            else
                assert_int_equal(ps_table_erase(copy, &keys[i], 1, NULL), 0);
        }
    }
}

static void test_stream_positions(void **state) {
    (void)state;
    char dir[256], path[600], absent[300];
    tc_tmpdir(dir, sizeof dir, "streampos");
    ps_catalog_t *cat, *rep;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_catalog_set_changelog(cat, 1 << 16);
    ps_table_t *a = tc_add(cat, "name=a,dim=4,optimizer=sgd"),
               *b = tc_add(cat, "name=b,dim=3,optimizer=adagrad");
    for (int k = 1; k <= 3; k++) {
        tc_round(a, k);
        tc_round(b, k);
    }
    ps_changelog_t *log;
    bool started;
    assert_int_equal(ps_catalog_changelog_start(cat, a, &log, &started), 0); /* a followed */
    assert_true(started);
    tc_round(a, 4);
    uint64_t oldest, head;
    ps_changelog_bounds(log, &oldest, &head);
    ps_ckpt_t *ck, *ro;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 5, .full_every = 2};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0); /* 1, full */
    ps_ckpt_table_info_t ti[4];
    size_t n;
    assert_int_equal(ps_ckpt_tables(dir, 0, ti, 4, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ti[0].name, "a"); /* in name order, as the catalog lists them */
    assert_true(ti[0].uid == ps_table_uid(a) && ti[0].log_position == head);
    assert_true(ti[0].rows == ps_table_count(a) && ti[0].version == ps_table_version(a));
    char cfg[2048];
    ps_table_config_format(ps_table_config(a), cfg, sizeof cfg);
    assert_string_equal(ti[0].config, cfg);
    assert_true(ti[1].uid == ps_table_uid(b) && ti[1].log_position == UINT64_MAX); /* no log */
    assert_int_equal(ps_ckpt_tables(dir, 0, ti, 1, &n), 0); /* cap 1: one copied, 2 counted */
    assert_int_equal(n, 2);
    /* pushes go on; the next checkpoint (incremental) records the head before its cut */
    tc_round(a, 5);
    ps_changelog_bounds(log, &oldest, &head);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0); /* 2, incremental */
    for (int k = 6; k <= 8; k++)
        tc_round(a, k); /* after the cut: only the stream has them */
    assert_int_equal(ps_ckpt_tables(dir, 2, ti, 4, &n), 0);
    assert_true(n == 2 && ti[0].log_position == head && ti[0].uid == ps_table_uid(a));
    /* a replica: restore read-only, then the stream from log_position: the live table's rows */
    assert_int_equal(ps_catalog_create(&rep), 0);
    ps_ckpt_opts_t ro_o = {.dir = dir, .keep = 1, .full_every = 1, .read_only = true};
    assert_int_equal(ps_ckpt_create(rep, &ro_o, &ro), 0);
    uint64_t got;
    assert_int_equal(ps_ckpt_restore(ro, 0, &got), 0);
    assert_int_equal(got, 2);
    ps_table_t *ra = get(rep, "a");
    apply_log(a, ti[0].log_position, ra);
    assert_same_weights(a, ra);
    assert_int_equal(ps_ckpt_write(ro, NULL), PC_ESTATE);
    /* read-only: leftovers stay, a missing directory is not created */
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000009.tmp", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    ps_ckpt_destroy(ro);
    assert_int_equal(ps_ckpt_create(rep, &ro_o, &ro), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    ps_ckpt_destroy(ro);
    snprintf(absent, sizeof absent, "%s/none", dir);
    ro_o.dir = absent;
    assert_int_equal(ps_ckpt_create(rep, &ro_o, &ro), 0);
    assert_int_equal(ps_ckpt_restore(ro, 0, NULL), PC_ENOTFOUND);
    assert_int_equal(stat(absent, &st), -1);
    ps_ckpt_destroy(ro);
    assert_int_equal(ps_ckpt_tables(absent, 0, ti, 4, &n), PC_ENOTFOUND);
    assert_int_equal(ps_ckpt_tables(dir, 7, ti, 4, &n), PC_ENOTFOUND);
    /* an older manifest (format 1: no seal, no uid, no log_position): read as 0 and
     * UINT64_MAX, restorable */
    manifest_path(dir, 1, path, sizeof path);
    size_t len, w = 0;
    char *text = manifest_text(path, &len);
    static char out[1 << 16];
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (!strstr(line, "\"uid\"") && !strstr(line, "\"log_position\""))
            w += (size_t)snprintf(out + w, sizeof out - w, "%s\n", line);
    free(text);
    char *fmt = strstr(out, "\"format\":\t2");
    assert_non_null(fmt);
    fmt[10] = '1';
    manifest_put(path, out, w, false);
    assert_int_equal(ps_ckpt_tables(dir, 1, ti, 4, &n), 0);
    assert_true(n == 2 && ti[0].uid == 0 && ti[0].log_position == UINT64_MAX);
    assert_true(ti[1].uid == 0 && ti[1].log_position == UINT64_MAX);
    ro_o.dir = dir;
    assert_int_equal(ps_ckpt_create(rep, &ro_o, &ro), 0);
    assert_int_equal(ps_ckpt_restore(ro, 1, NULL), 0);
    ps_ckpt_destroy(ro);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(rep);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* A removal whose tombstone could not be logged (no memory): the table's next checkpoint is
 * written whole, so checkpoints go on (each incremental one failed with PC_ENOMEM before, until
 * the process restarted) and restore the live table, the removed key absent. */
static void test_lost_removal(void **state) {
    (void)state;
    const char *spec = "name=lost,dim=4,optimizer=sgd,shards=1";
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "lost");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *t = tc_add(cat, spec);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 10, .full_every = 5};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    enum { MINE = 100 };
    uint64_t mine[MINE];
    float g[MINE * 4] = {0};
    for (int i = 0; i < MINE; i++)
        mine[i] = 0x5EED0000u + (uint64_t)i;
    assert_int_equal(ps_table_push(t, mine, MINE, g, MINE * 4, NULL), 0);
    tc_round(t, 1);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0); /* 1: full; removals are logged from here */
    const uint64_t count = ps_table_count(t);
    for (int i = 0; i < MINE && !ps_table_needs_full(t); i++) { /* the log's growth fails */
        pc_mem_fail_after(i);
        const int rc = ps_table_erase(t, &mine[i], 1, NULL);
        pc_mem_fail_after(-1);
        assert_true(rc == 0 || rc == PC_ENOMEM);
    }
    assert_true(ps_table_needs_full(t));
    assert_true(ps_table_count(t) < count);
    ps_ckpt_result_t r;
    for (int k = 2; k <= 3; k++) { /* 2: incremental, this table whole; 3: incremental again */
        assert_int_equal(ps_ckpt_write(ck, &r), 0);
        assert_true(r.incremental);
        assert_false(ps_table_needs_full(t));
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        assert_int_equal(ps_ckpt_restore(ck2, r.id, NULL), 0);
        tc_assert_equal(get(c2, "lost"), t);
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
        tc_round(t, 3); /* with erasures: tombstones for checkpoint 3 */
    }
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
}

/* A row file replaced by another one that is whole in itself, of the same table settings, cut
 * and version (another server's checkpoint of the same step): refused on restore, as the
 * manifest names each file's counts, size and checksum (only the file's own footer was read). */
static void test_row_file_swapped(void **state) {
    (void)state;
    char dir[2][256], from[600], to[600];
    ps_table_t *t[2];
    ps_catalog_t *cat[2];
    for (int i = 0; i < 2; i++) {
        tc_tmpdir(dir[i], sizeof dir[i], i ? "swapb" : "swapa");
        assert_int_equal(ps_catalog_create(&cat[i]), 0);
        t[i] = tc_add(cat[i], "name=k,dim=4,optimizer=sgd");
        tc_round(t[i], i + 1); /* one push each, of other keys */
        ps_ckpt_t *ck;
        ps_ckpt_opts_t o = {.dir = dir[i], .keep = 5, .full_every = 4};
        assert_int_equal(ps_ckpt_create(cat[i], &o, &ck), 0);
        assert_int_equal(ps_ckpt_write(ck, NULL), 0);
        ps_ckpt_destroy(ck);
    }
    snprintf(from, sizeof from, "%s/ckpt-%020d/t-k.rows", dir[0], 1);
    snprintf(to, sizeof to, "%s/ckpt-%020d/t-k.rows", dir[1], 1);
    char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(pc_fs_read_all(from, 1 << 26, &bytes, &len), 0);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
    free(bytes);
    ps_catalog_t *c2;
    ps_ckpt_t *ck2;
    ps_ckpt_opts_t o = {.dir = dir[1], .keep = 5, .full_every = 4};
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
    assert_int_equal(ps_ckpt_restore(ck2, 1, NULL), PC_ECORRUPT);
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    for (int i = 0; i < 2; i++) {
        ps_catalog_destroy(cat[i]);
        tc_rmdir(dir[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_removal),
        cmocka_unit_test(test_roundtrip_every_optimizer),
        cmocka_unit_test(test_incremental_chain),
        cmocka_unit_test(test_chains_of_unequal_length),
        cmocka_unit_test(test_consistent_under_pushes),
        cmocka_unit_test(test_retention_and_damage),
        cmocka_unit_test(test_rollback_abandons_newer),
        cmocka_unit_test(test_manifest_settings),
        cmocka_unit_test(test_manifest_json_oom),
        cmocka_unit_test(test_manifest_seal),
        cmocka_unit_test(test_row_file_swapped),
        cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_regressions),
        cmocka_unit_test(test_stream_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
