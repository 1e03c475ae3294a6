/* pc_error.h: the one table of EmberPS error codes.
 *
 * Every fallible function in the project returns int: 0 on success or one of the negative codes
 * below. The table gives each code a stable name ("PC_EDIM") and a human message; callers print
 * pc_strerror(rc) and scripts can match pc_err_name(rc). Third-party status codes (gRPC, RocksDB,
 * CUDA, ...) are translated into these once, at the library boundary.
 *
 * Thread rule: all functions are thread-safe (they read constant tables).
 */
#ifndef PC_ERROR_H
#define PC_ERROR_H

/* XX(name, value, message). Values are stable: they may travel over the wire. */
#define PC_ERRNO_MAP(XX)                                              \
    XX(EINVAL, -1, "invalid argument")                                \
    XX(ENOMEM, -2, "out of memory")                                   \
    XX(ENOTFOUND, -3, "not found")                                    \
    XX(EEXIST, -4, "already exists")                                  \
    XX(EDIM, -5, "wrong dimension")                                   \
    XX(ERANGE, -6, "value out of range")                              \
    XX(ETOOBIG, -7, "size over the configured limit")                 \
    XX(EFULL, -8, "capacity exhausted")                               \
    XX(EPARSE, -9, "malformed input")                                 \
    XX(EIO, -10, "input/output error")                                \
    XX(ECORRUPT, -11, "data corrupted (checksum or format mismatch)") \
    XX(ENOSPC, -12, "not enough free disk space")                     \
    XX(ETIMEDOUT, -13, "timed out")                                   \
    XX(EUNAVAIL, -14, "service unavailable")                          \
    XX(EWRONGSLOT, -15, "key slot not owned by this server")          \
    XX(EAUTH, -16, "authentication failed")                           \
    XX(ECLOSED, -17, "closed or shutting down")                       \
    XX(ECANCELED, -18, "canceled")                                    \
    XX(EAGAIN, -19, "temporarily unavailable, try again")             \
    XX(EUNSUPPORTED, -20, "not supported")                            \
    XX(ESYS, -21, "system call failed")                               \
    XX(EINTERNAL, -22, "internal error")

typedef enum {
    PC_OK = 0,
#define PC__ERR_ENUM(name, value, msg) PC_##name = value,
    PC_ERRNO_MAP(PC__ERR_ENUM)
#undef PC__ERR_ENUM
} pc_err_t;

/* Message for a code; "unknown error" for a value not in the table. Never NULL. */
const char *pc_strerror(int err);

/* Name of a code ("PC_EDIM"); "PC_OK" for 0 and "PC_UNKNOWN" otherwise. Never NULL. */
const char *pc_err_name(int err);

#endif
