/* gRPC's own log lines through pc_log: formatted, with the level mapped and a rate limit. */
#include "test_util.h"

#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_grpc_log.h"
#include "pc_log.h"

static void test_route(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    pc_log_init(m, PC_LOG_INFO, "tester");
    pc_grpc_log_route();
    pc_grpc_log_route(); /* idempotent */
    grpc_init();         /* reads the verbosity gRPC logs at (ERROR unless GRPC_VERBOSITY) */
    for (int i = 0; i < 100; i++) /* a flood, as failed handshakes make */
        gpr_log(GPR_ERROR, "Handshake failed with fatal error %d", i);
    gpr_log(GPR_INFO, "an INFO line is DEBUG here: not shown at level info");
    fflush(m);
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "grpc: Handshake failed")); p++)
        lines++;
    assert_int_equal(lines, 5); /* the limit: 5 per 10 s */
    assert_non_null(strstr(buf, " W tester "));
    assert_null(strstr(buf, "INFO line"));
    grpc_shutdown();
    pc_log_init(NULL, PC_LOG_INFO, "tester");
    fclose(m);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_route)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
