/* Logging levels and format; counted allocation by tag. */
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
    assert_null(pc_calloc(PC_MEM_OTHER, SIZE_MAX / 2, 4)); /* overflow refused */
    assert_string_equal(pc_mem_tag_name(PC_MEM_ROWS), "rows");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_log), cmocka_unit_test(test_alloc)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
