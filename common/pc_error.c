/* pc_error.c: name, message and gRPC status lookup over PC_ERRNO_MAP. */
#include "pc_error.h"

#include <string.h>

const char *pc_strerror(int err) {
    switch (err) {
        case PC_OK:
            return "success";
#define PC__ERR_MSG(name, value, bare, grpc, msg) \
    case PC_##name:                               \
        return msg;
            PC_ERRNO_MAP(PC__ERR_MSG)
#undef PC__ERR_MSG
        default:
            return "unknown error";
    }
}

const char *pc_err_name(int err) {
    switch (err) {
        case PC_OK:
            return "PC_OK";
#define PC__ERR_NAME(name, value, bare, grpc, msg) \
    case PC_##name:                                \
        return "PC_" #name;
            PC_ERRNO_MAP(PC__ERR_NAME)
#undef PC__ERR_NAME
        default:
            return "PC_UNKNOWN";
    }
}

int pc_err_to_grpc(int err) {
    switch (err) {
        case PC_OK:
            return 0;
#define PC__ERR_GRPC(name, value, bare, grpc, msg) \
    case PC_##name:                                \
        return grpc;
            PC_ERRNO_MAP(PC__ERR_GRPC)
#undef PC__ERR_GRPC
        default:
            return 13; /* INTERNAL */
    }
}

/* One row of the table, for the searches of the way back. */
typedef struct row {
    int err, bare, grpc;
    const char *name;
} row_t;

static const row_t k_rows[] = {
#define PC__ERR_ROW(name, value, bare, grpc, msg) {PC_##name, bare, grpc, "PC_" #name},
    PC_ERRNO_MAP(PC__ERR_ROW)
#undef PC__ERR_ROW
};
#define NROWS (sizeof k_rows / sizeof k_rows[0])

int pc_err_from_grpc(int status, const char *name, size_t len) {
    if (status == 0)
        return 0;
    for (size_t i = 0; name && i < NROWS; i++)
        if (k_rows[i].grpc == status && strlen(k_rows[i].name) == len &&
            memcmp(k_rows[i].name, name, len) == 0)
            return k_rows[i].err;
    for (size_t i = 0; i < NROWS; i++)
        if (k_rows[i].grpc == status && k_rows[i].bare)
            return k_rows[i].err;
    return PC_EINTERNAL;
}
