/* Logging levels, format and rate limit; counted allocation by tag. */
#include "test_util.h"

#include <string.h>

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"

static void test_log(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    pc_log_init(m, PC_LOG_WARN, "tester[shard 3]");
    int evaluated = 0;
    PC_INFO("hidden %d", ++evaluated); /* level check happens before formatting */
    PC_WARN("shown %d", 7);
    PC_ERROR("also shown");
    fflush(m);
    assert_int_equal(evaluated, 0);
    assert_null(strstr(buf, "hidden"));
    assert_non_null(strstr(buf, " W tester[shard 3] test_log_alloc.c:"));
    assert_non_null(strstr(buf, "shown 7\n"));
    assert_non_null(strstr(buf, " E tester[shard 3]"));
    pc_log_level_t lv;
    assert_int_equal(pc_log_level_parse("DEBUG", &lv), 0);
    assert_int_equal(lv, PC_LOG_DEBUG);
    assert_int_equal(pc_log_level_parse("loud", &lv), PC_EINVAL);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    PC_ERROR("%s", big); /* truncated, still one line */
    fflush(m);
    assert_int_equal(buf[len - 1], '\n');
    pc_log_init(NULL, PC_LOG_INFO, "ember");
    fclose(m);
    free(buf);
}

/* The rate limit: `lines` per window, refusals counted and reported by the next line let
 * through; PC_LOG_LIMITED formats nothing it refuses and ends the next line with the count. */
static void test_log_limit(void **state) {
    (void)state;
    pc_log_limit_t l;
    pc_log_limit_init(&l, 3, 1000);
    uint64_t sup = 99;
    for (uint64_t t = 5000; t < 5003; t++) {
        assert_true(pc_log_limit_take(&l, t, &sup));
        assert_int_equal(sup, 0);
    }
    for (uint64_t t = 5003; t < 5010; t++)
        assert_false(pc_log_limit_take(&l, t, &sup));
    assert_false(pc_log_limit_take(&l, 5999, &sup)); /* same window: 8 refused */
    assert_true(pc_log_limit_take(&l, 6000, &sup));  /* next window */
    assert_int_equal(sup, 8);
    assert_true(pc_log_limit_take(&l, 6001, &sup));
    assert_int_equal(sup, 0);
    pc_log_limit_close(&l);

    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    pc_log_init(m, PC_LOG_INFO, "tester");
    pc_log_limit_init(&l, 2, 60000); /* one window for the whole test */
    int evaluated = 0;
    for (int i = 0; i < 50; i++)
        PC_LOG_LIMITED(&l, PC_LOG_WARN, "noisy %d", ++evaluated);
    fflush(m);
    assert_int_equal(evaluated, 2); /* refused lines are not formatted */
    assert_non_null(strstr(buf, " W tester test_log_alloc.c:"));
    assert_non_null(strstr(buf, "noisy 2\n"));
    assert_null(strstr(buf, "noisy 3"));
    pc__log_write_limited(PC_LOG_WARN, __FILE__, __LINE__, 48, "noisy %d", 51);
    fflush(m);
    assert_non_null(strstr(buf, "noisy 51 [48 more suppressed]\n"));
    pc_log_limit_close(&l);
    pc_log_init(NULL, PC_LOG_INFO, "ember");
    fclose(m);
    free(buf);
}

static void test_alloc(void **state) {
    (void)state;
    uint64_t before = pc_mem_used(PC_MEM_SCRATCH);
    void *p = pc_malloc(PC_MEM_SCRATCH, 1000);
    assert_non_null(p);
    assert_int_equal(pc_mem_used(PC_MEM_SCRATCH) - before, 1000);
    p = pc_realloc(PC_MEM_SCRATCH, p, 1000, 5000);
    assert_int_equal(pc_mem_used(PC_MEM_SCRATCH) - before, 5000);
    pc_free(PC_MEM_SCRATCH, p, 5000);
    assert_int_equal(pc_mem_used(PC_MEM_SCRATCH), before);

    uint64_t vb = pc_mem_used(PC_MEM_INDEX);
    char *v = pc_vm_alloc(PC_MEM_INDEX, 1 << 20);
    assert_non_null(v);
    assert_int_equal(v[12345], 0); /* zero-filled */
    v[0] = 7;
    v = pc_vm_resize(PC_MEM_INDEX, v, 1 << 20, 64 << 20);
    assert_non_null(v);
    assert_int_equal(v[0], 7); /* contents kept */
    assert_int_equal(pc_mem_used(PC_MEM_INDEX) - vb, 64 << 20);
    pc_vm_advise_huge(v, 64 << 20, 64 << 20);
    pc_vm_free(PC_MEM_INDEX, v, 64 << 20);
    assert_int_equal(pc_mem_used(PC_MEM_INDEX), vb);
    /* Populated: still zeros, writable, counted once; NULL and 0 bytes are no-ops. */
    char *z = pc_vm_alloc(PC_MEM_INDEX, (3 << 20) + 100);
    assert_non_null(z);
    pc_vm_populate(z, (3 << 20) + 100);
    pc_vm_populate(NULL, 1 << 20);
    pc_vm_populate(z, 0);
    assert_int_equal(z[0], 0);
    assert_int_equal(z[(3 << 20) + 99], 0);
    z[0] = z[(3 << 20) + 99] = 9;
    assert_int_equal(z[0] + z[(3 << 20) + 99], 18);
    assert_int_equal(pc_mem_used(PC_MEM_INDEX) - vb, (3 << 20) + 100);
    pc_vm_free(PC_MEM_INDEX, z, (3 << 20) + 100);
    assert_int_equal(pc_mem_used(PC_MEM_INDEX), vb);
    assert_null(pc_calloc(PC_MEM_OTHER, SIZE_MAX / 2, 4)); /* overflow refused */
    assert_null(pc_vm_alloc(PC_MEM_OTHER, SIZE_MAX - 100));

    /* Large mappings of sizes that are not whole pages: 2 MiB aligned, contents kept and
     * alignment preserved through growth in place or by moving, nothing left mapped. */
    const size_t odd = (2u << 20) + 100;
    uint64_t before_other = pc_mem_used(PC_MEM_OTHER);
    char *a = pc_vm_alloc(PC_MEM_OTHER, odd);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a & ((2u << 20) - 1), 0);
    a[odd - 1] = 42;
    char *block = pc_vm_alloc(PC_MEM_OTHER, 1 << 20); /* may sit right behind a */
    size_t sizes[] = {(5u << 20) + 7, (9u << 20) + 4095, (3u << 20) + 1};
    size_t cur = odd;
    for (int i = 0; i < 3; i++) {
        a = pc_vm_resize(PC_MEM_OTHER, a, cur, sizes[i]);
        assert_non_null(a);
        assert_int_equal((uintptr_t)a & ((2u << 20) - 1), 0);
        assert_int_equal(a[odd - 1], 42);
        a[sizes[i] - 1] = 7; /* the whole new size is usable */
        cur = sizes[i];
    }
    pc_vm_free(PC_MEM_OTHER, block, 1 << 20);
    pc_vm_free(PC_MEM_OTHER, a, cur);
    assert_int_equal(pc_mem_used(PC_MEM_OTHER), before_other);
    /* the process mapped nothing more than it mapped before (no leaked tails) */
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    size_t nmaps = 0;
    while (fgets(line, sizeof line, maps))
        nmaps++;
    fclose(maps);
    for (int round = 0; round < 20; round++) {
        char *x = pc_vm_alloc(PC_MEM_OTHER, (2u << 20) + 100 + (size_t)round * 4096 + 3);
        x = pc_vm_resize(PC_MEM_OTHER, x, (2u << 20) + 100 + (size_t)round * 4096 + 3,
                         (6u << 20) + 5);
        pc_vm_free(PC_MEM_OTHER, x, (6u << 20) + 5);
    }
    maps = fopen("/proc/self/maps", "r");
    size_t nmaps2 = 0;
    while (fgets(line, sizeof line, maps))
        nmaps2++;
    fclose(maps);
    assert_true(nmaps2 <= nmaps + 2);
    assert_string_equal(pc_mem_tag_name(PC_MEM_ROWS), "rows");
}

/* pc_sappend_u64: grows past its first 4096, keeps every value in order, and a refused growth
 * leaves the array as it was. */
static void test_sappend(void **state) {
    (void)state;
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t i = 0; i < 10000; i++)
        assert_true(pc_sappend_u64(&v, &n, &cap, i * 7));
    assert_int_equal(n, 10000);
    assert_true(cap >= n);
    for (size_t i = 0; i < n; i++)
        assert_true(v[i] == i * 7);
    while (n < cap)
        assert_true(pc_sappend_u64(&v, &n, &cap, 1));
    const size_t full = cap;
    pc_mem_fail_after(0); /* the next allocation fails */
    assert_false(pc_sappend_u64(&v, &n, &cap, 99));
    pc_mem_fail_after(-1);
    assert_int_equal(n, full);
    assert_int_equal(cap, full);
    assert_true(v[9999] == 9999 * 7);
    assert_true(pc_sappend_u64(&v, &n, &cap, 99));
    assert_true(v[full] == 99);
    pc_sfree(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_log), cmocka_unit_test(test_log_limit),
                                       cmocka_unit_test(test_alloc),
                                       cmocka_unit_test(test_sappend)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
