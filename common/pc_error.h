/* pc_error.h: the one table of EmberPS error codes.
 *
 * Every fallible function in the project returns int: 0 on success or one of the negative codes
 * below. The table gives each code a stable name ("PC_EDIM") and a human message; callers print
 * pc_strerror(rc) and scripts can match pc_err_name(rc). Third-party status codes (gRPC, RocksDB,
 * CUDA, ...) are translated into these once, at the library boundary.
 *
 * DESIGN (gRPC): the table also says which gRPC status each code travels as, so the server and
 * every client share one mapping. Several codes share a status (PC_ETOOBIG and PC_ENOSPC are both
 * RESOURCE_EXHAUSTED), so a status alone cannot name its code: the server sends the code's name
 * beside the status, as trailing metadata PC_GRPC_ERROR_KEY ("emberps-error: PC_ENOSPC"), and
 * the client turns (status, name) back into the exact code with pc_err_from_grpc. A status that
 * arrives without a name (another server, or one gRPC made itself: deadline, unreachable, message
 * over the size limit) stands for the one code of its status marked `bare`. Statuses are plain
 * numbers (grpc/status.h), so common/ does not depend on gRPC.
 *
 * Thread rule: all functions are thread-safe (they read constant tables).
 */
#ifndef PC_ERROR_H
#define PC_ERROR_H

#include <stddef.h>

/* XX(name, value, bare, grpc, message).
 *   value  stable: codes travel over the wire (the data plane, files, gRPC metadata).
 *   bare   1 for the one code of its status that the status means when it comes without a name;
 *          a status no row marks bare means PC_EINTERNAL.
 *   grpc   the gRPC status the code travels as (grpc/status.h numbers; names in comments). */
// clang-format off
#define PC_ERRNO_MAP(XX)                                                                           \
    XX(EINVAL,        -1, 1,  3 /* INVALID_ARGUMENT */, "invalid argument")                        \
    XX(ENOMEM,        -2, 0,  8 /* RESOURCE_EXHAUSTED */, "out of memory")                         \
    XX(ENOTFOUND,     -3, 1,  5 /* NOT_FOUND */, "not found")                                      \
    XX(EEXIST,        -4, 1,  6 /* ALREADY_EXISTS */, "already exists")                            \
    XX(EDIM,          -5, 0,  3 /* INVALID_ARGUMENT */, "wrong dimension")                         \
    XX(ERANGE,        -6, 0,  3 /* INVALID_ARGUMENT */, "value out of range")                      \
    XX(ETOOBIG,       -7, 1,  8 /* RESOURCE_EXHAUSTED */, "size over the configured limit")        \
    XX(EFULL,         -8, 0,  8 /* RESOURCE_EXHAUSTED */, "capacity exhausted")                    \
    XX(EPARSE,        -9, 0,  3 /* INVALID_ARGUMENT */, "malformed input")                         \
    XX(EIO,          -10, 0, 13 /* INTERNAL */, "input/output error")                              \
    XX(ECORRUPT,     -11, 1, 15 /* DATA_LOSS */, "data corrupted (checksum or format mismatch)")   \
    XX(ENOSPC,       -12, 0,  8 /* RESOURCE_EXHAUSTED */, "not enough free disk space")            \
    XX(ETIMEDOUT,    -13, 1,  4 /* DEADLINE_EXCEEDED */, "timed out")                              \
    XX(EUNAVAIL,     -14, 1, 14 /* UNAVAILABLE */, "service unavailable")                          \
    XX(EWRONGSLOT,   -15, 0,  9 /* FAILED_PRECONDITION */, "key slot not owned by this server")    \
    XX(EAUTH,        -16, 1, 16 /* UNAUTHENTICATED */, "authentication failed")                    \
    XX(ECLOSED,      -17, 0, 14 /* UNAVAILABLE */, "closed or shutting down")                      \
    XX(ECANCELED,    -18, 1,  1 /* CANCELLED */, "canceled")                                       \
    XX(EAGAIN,       -19, 0,  9 /* FAILED_PRECONDITION */, "temporarily unavailable, try again")   \
    XX(EUNSUPPORTED, -20, 1, 12 /* UNIMPLEMENTED */, "not supported")                              \
    XX(ESYS,         -21, 0, 13 /* INTERNAL */, "system call failed")                              \
    XX(EINTERNAL,    -22, 1, 13 /* INTERNAL */, "internal error")                                  \
    XX(ESTATE,       -23, 1,  9 /* FAILED_PRECONDITION */, "not possible in the current state")   \
    XX(EOWNED,       -24, 0,  9 /* FAILED_PRECONDITION */, "table owned by another job")       \
    XX(ETLS,         -25, 0, 14 /* UNAVAILABLE */, "TLS failed (handshake, certificate or protocol)") \
    XX(EREADONLY,    -26, 0,  9 /* FAILED_PRECONDITION */, "read-only: a serving replica takes no writes") \
    XX(EFENCED,      -27, 0,  9 /* FAILED_PRECONDITION */, "fenced: a newer generation of the job took over the table")
// clang-format on

typedef enum {
    PC_OK = 0,
#define PC__ERR_ENUM(name, value, bare, grpc, msg) PC_##name = value,
    PC_ERRNO_MAP(PC__ERR_ENUM)
#undef PC__ERR_ENUM
} pc_err_t;

/* Message for a code; "unknown error" for a value not in the table. Never NULL. */
const char *pc_strerror(int err);

/* Name of a code ("PC_EDIM"); "PC_OK" for 0 and "PC_UNKNOWN" otherwise. Never NULL. */
const char *pc_err_name(int err);

/* The gRPC trailing-metadata key that carries a failed call's code name (pc_err_name). */
#define PC_GRPC_ERROR_KEY "emberps-error"

/* The gRPC status code `err` travels as: 0 for 0, the table's column for a code, 13 (INTERNAL)
 * for a value not in the table. */
int pc_err_to_grpc(int err);

/* The code of a gRPC status: 0 for status 0; the code named by name[0..len) ("PC_ENOSPC", no
 * terminator needed; NULL: none) when it is in the table and travels as `status`; otherwise the
 * status's bare code, PC_EINTERNAL for a status no code is bare for. `name` is borrowed for the
 * call. pc_err_from_grpc(pc_err_to_grpc(e), pc_err_name(e), strlen(...)) == e for every code. */
int pc_err_from_grpc(int status, const char *name, size_t len);

#endif
