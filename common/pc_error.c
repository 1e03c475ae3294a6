/* pc_error.c: name and message lookup over PC_ERRNO_MAP. */
#include "pc_error.h"

const char *pc_strerror(int err) {
    switch (err) {
        case PC_OK:
            return "success";
#define PC__ERR_MSG(name, value, msg) \
    case PC_##name:                   \
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
#define PC__ERR_NAME(name, value, msg) \
    case PC_##name:                    \
        return "PC_" #name;
            PC_ERRNO_MAP(PC__ERR_NAME)
#undef PC__ERR_NAME
        default:
            return "PC_UNKNOWN";
    }
}
