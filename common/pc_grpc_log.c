/* pc_grpc_log.c: see pc_grpc_log.h. */
#include "pc_grpc_log.h"

#include "pc_log.h"

#include <grpc/support/log.h>
#include <pthread.h>

static pc_log_limit_t g_limit; /* gRPC's hook has no context: see the header's DESIGN */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void route(gpr_log_func_args *a) {
    const pc_log_level_t level = a->severity == GPR_LOG_SEVERITY_ERROR  ? PC_LOG_WARN
                                 : a->severity == GPR_LOG_SEVERITY_INFO ? PC_LOG_DEBUG
                                                                        : PC_LOG_TRACE;
    uint64_t suppressed;
    if (pc_log_enabled(level) && pc_log_limit_take(&g_limit, pc_log_now_ms(), &suppressed))
        pc__log_write_limited(level, a->file ? a->file : "grpc", a->line, suppressed, "grpc: %s",
                              a->message ? a->message : "");
}

static void install(void) {
    pc_log_limit_init(&g_limit, 5, 10000);
    gpr_set_log_function(route);
}

void pc_grpc_log_route(void) {
    pthread_once(&g_once, install);
}
