/* Error table: every code has a distinct name and message; unknown codes are handled. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"

static void test_names_and_messages(void **state) {
    (void)state;
    int codes[] = {
#define X(name, value, msg) PC_##name,
        PC_ERRNO_MAP(X)
#undef X
    };
    size_t n = sizeof codes / sizeof codes[0];
    assert_true(n >= 20);
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        assert_string_not_equal(pc_strerror(codes[i]), "unknown error");
        assert_string_not_equal(pc_err_name(codes[i]), "PC_UNKNOWN");
        assert_memory_equal(pc_err_name(codes[i]), "PC_E", 4);
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(codes[i], codes[j]);
            assert_string_not_equal(pc_err_name(codes[i]), pc_err_name(codes[j]));
        }
    }
    assert_string_equal(pc_err_name(PC_EDIM), "PC_EDIM");
    assert_string_equal(pc_strerror(PC_EDIM), "wrong dimension");
    assert_string_equal(pc_err_name(0), "PC_OK");
    assert_string_equal(pc_strerror(-9999), "unknown error");
    assert_string_equal(pc_err_name(12345), "PC_UNKNOWN");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_names_and_messages)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
