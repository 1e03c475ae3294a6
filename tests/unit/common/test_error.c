/* Error table: every code has a distinct name and message; unknown codes are handled; every code
 * travels as a gRPC status and comes back as itself (with its name, and each status alone as its
 * one bare code). */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"

static const int k_codes[] = {
#define X(name, value, bare, grpc, msg) PC_##name,
    PC_ERRNO_MAP(X)
#undef X
};
#define NCODES (sizeof k_codes / sizeof k_codes[0])

static void test_names_and_messages(void **state) {
    (void)state;
    assert_true(NCODES >= 20);
    for (size_t i = 0; i < NCODES; i++) {
        assert_true(k_codes[i] < 0);
        assert_string_not_equal(pc_strerror(k_codes[i]), "unknown error");
        assert_string_not_equal(pc_err_name(k_codes[i]), "PC_UNKNOWN");
        assert_memory_equal(pc_err_name(k_codes[i]), "PC_E", 4);
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(k_codes[i], k_codes[j]);
            assert_string_not_equal(pc_err_name(k_codes[i]), pc_err_name(k_codes[j]));
        }
    }
    assert_string_equal(pc_err_name(PC_EDIM), "PC_EDIM");
    assert_string_equal(pc_strerror(PC_EDIM), "wrong dimension");
    assert_string_equal(pc_err_name(0), "PC_OK");
    assert_string_equal(pc_strerror(-9999), "unknown error");
    assert_string_equal(pc_err_name(12345), "PC_UNKNOWN");
}

static int from_name(int status, const char *name) {
    return pc_err_from_grpc(status, name, strlen(name));
}

static void test_grpc_round_trip(void **state) {
    (void)state;
    int bare_of[17] = {0}; /* gRPC statuses are 0..16 */
    for (size_t i = 0; i < NCODES; i++) {
        const int e = k_codes[i], st = pc_err_to_grpc(e);
        assert_true(st > 0 && st <= 16);
        /* With its name: exactly itself, whatever else shares the status. */
        assert_int_equal(from_name(st, pc_err_name(e)), e);
        /* The name needs no terminator: only len bytes count. */
        char buf[64];
        snprintf(buf, sizeof buf, "%sX", pc_err_name(e));
        assert_int_equal(pc_err_from_grpc(st, buf, strlen(buf) - 1), e);
        if (pc_err_from_grpc(st, NULL, 0) == e) {
            assert_int_equal(bare_of[st], 0); /* one bare code per status */
            bare_of[st] = e;
        }
    }
    /* Every status the table uses has its bare code, which is a code of that status. */
    for (size_t i = 0; i < NCODES; i++) {
        const int st = pc_err_to_grpc(k_codes[i]);
        assert_int_not_equal(bare_of[st], 0);
        assert_int_equal(pc_err_to_grpc(bare_of[st]), st);
    }
    /* Codes that share a status (the cases a status alone got wrong). */
    assert_int_equal(pc_err_to_grpc(PC_ENOSPC), pc_err_to_grpc(PC_ETOOBIG));
    assert_int_equal(from_name(8, "PC_ENOSPC"), PC_ENOSPC);
    assert_int_equal(from_name(9, "PC_EAGAIN"), PC_EAGAIN);
    assert_int_equal(from_name(9, "PC_EWRONGSLOT"), PC_EWRONGSLOT);
    /* The statuses the server sent before this table: unchanged. */
    assert_int_equal(pc_err_to_grpc(PC_EDIM), 3);          /* INVALID_ARGUMENT */
    assert_int_equal(pc_err_to_grpc(PC_ENOTFOUND), 5);     /* NOT_FOUND */
    assert_int_equal(pc_err_to_grpc(PC_ENOSPC), 8);        /* RESOURCE_EXHAUSTED */
    assert_int_equal(pc_err_to_grpc(PC_EAGAIN), 9);        /* FAILED_PRECONDITION */
    assert_int_equal(pc_err_to_grpc(PC_EUNSUPPORTED), 12); /* UNIMPLEMENTED */
    assert_int_equal(pc_err_to_grpc(PC_EIO), 13);          /* INTERNAL */
    /* Foreign or bare statuses: the status column's code. */
    assert_int_equal(pc_err_from_grpc(0, NULL, 0), 0);
    assert_int_equal(pc_err_from_grpc(8, NULL, 0), PC_ETOOBIG); /* e.g. gRPC's size limit */
    assert_int_equal(pc_err_from_grpc(4, NULL, 0), PC_ETIMEDOUT);
    assert_int_equal(pc_err_from_grpc(14, NULL, 0), PC_EUNAVAIL);
    assert_int_equal(pc_err_from_grpc(9, NULL, 0), PC_ESTATE);
    assert_int_equal(pc_err_from_grpc(2, NULL, 0), PC_EINTERNAL); /* UNKNOWN: no code */
    assert_int_equal(pc_err_from_grpc(7, NULL, 0), PC_EINTERNAL); /* PERMISSION_DENIED */
    /* A name that is not a code, or not one of that status, is ignored. */
    assert_int_equal(from_name(8, "PC_NOPE"), PC_ETOOBIG);
    assert_int_equal(from_name(8, "PC_EAGAIN"), PC_ETOOBIG);
    assert_int_equal(from_name(8, "PC_ENOSP"), PC_ETOOBIG);
    assert_int_equal(pc_err_to_grpc(0), 0);
    assert_int_equal(pc_err_to_grpc(-9999), 13);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_names_and_messages),
                                       cmocka_unit_test(test_grpc_round_trip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
