/* ps_api.h: the server's public API (proto/emberps.proto), independent of its transport.
 *
 * ps_api_call decodes one request message, runs it against the catalog and returns either the
 * encoded response or an error: an EmberPS code (pc_error.h), the gRPC status that code travels
 * as (pc_err_to_grpc, the one mapping) and a message. The gRPC transport (ps_grpc.h) sends the
 * status with the code's name beside it (metadata PC_GRPC_ERROR_KEY), so clients get the code
 * back exactly (pc_err_from_grpc). The transport and the fuzz target drive this; nothing here
 * depends on gRPC. Request sizes are bounded by the transport (max message length) before they
 * get here; key counts by `max_keys` here, and the rows a Lookup or Pull would return by
 * `max_reply` (PC_ETOOBIG naming the sizes, before any row is read or allocated).
 *
 * Thread rule: calls may run concurrently (the catalog and tables are thread-safe); the hooks
 * must be thread-safe too.
 */
#ifndef PS_API_H
#define PS_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "ps_catalog.h"
#include "ps_ckpt.h"

/* Names of the gRPC status codes (grpc/status.h numbering) that the API's codes travel as, for
 * callers that look at statuses (which code travels as which: PC_ERRNO_MAP). */
enum {
    PS_ST_OK = 0,
    PS_ST_CANCELLED = 1,
    PS_ST_INVALID_ARGUMENT = 3,
    PS_ST_DEADLINE_EXCEEDED = 4,
    PS_ST_NOT_FOUND = 5,
    PS_ST_ALREADY_EXISTS = 6,
    PS_ST_RESOURCE_EXHAUSTED = 8,
    PS_ST_FAILED_PRECONDITION = 9,
    PS_ST_UNIMPLEMENTED = 12,
    PS_ST_INTERNAL = 13,
    PS_ST_UNAVAILABLE = 14,
    PS_ST_DATA_LOSS = 15,
    PS_ST_UNAUTHENTICATED = 16,
};

typedef enum {
    PS_API_LOOKUP,
    PS_API_PULL,
    PS_API_PUSH,
    PS_API_CREATE_TABLE,
    PS_API_DROP_TABLE,
    PS_API_LIST_TABLES,
    PS_API_TABLE_STATS,
    PS_API_CHECKPOINT,
    PS_API_LIST_CHECKPOINTS,
    PS_API_GET_CLUSTER_MAP,
    PS_API_HEALTH,
    PS_API_RESTORE,
    PS_API_RESET_TABLE,
    PS_API_KV_SET, /* emberps.Coordinator */
    PS_API_KV_GET,
    PS_API_KV_LIST,
    PS_API_NMETHODS
} ps_api_method_t;

/* What the handlers reach. Hooks may be NULL (see each). */
typedef struct ps_api_env {
    ps_catalog_t *cat;
    uint32_t max_keys;    /* per Lookup/Pull/Push */
    uint64_t max_reply;   /* bytes of rows (+ found) a Lookup/Pull may return; 0: no limit */
    const char *ckpt_dir; /* ListCheckpoints, CheckpointResponse.dir (made absolute); NULL: none */
    uint32_t shard;
    uint64_t start_ns; /* pc_time_mono_ns() at start */
    void *ctx;
    /* Every key in a slot this server owns (NULL: owns all). */
    bool (*owns)(void *ctx, const uint64_t *keys, size_t n);
    /* Apply a Push's gradients to t (ps_table_push's contract; why gets one line on failure);
     * NULL: ps_table_push itself. ps-server's goes through the data plane's fence
     * (ps_dp_push). */
    int (*push)(void *ctx, ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
                size_t nf, ps_push_result_t *res, char *why, size_t cap);
    /* The cluster map text (malloc'ed) and version (NULL: GetClusterMap is UNAVAILABLE). */
    char *(*map_text)(void *ctx, uint64_t *version);
    /* Write a checkpoint now (NULL: Checkpoint is PC_ESTATE, FAILED_PRECONDITION). */
    int (*checkpoint)(void *ctx, ps_ckpt_result_t *res);
    /* Restore checkpoint id (0: the newest) into the serving tables; *restored its id;
     * PC_EUNSUPPORTED when this server cannot (NULL or that: Restore is PC_ESTATE,
     * FAILED_PRECONDITION). */
    int (*restore)(void *ctx, uint64_t id, uint64_t *restored);
    /* The coordinator's store (NULL: not the coordinator; its methods are PC_ESTATE,
     * FAILED_PRECONDITION). */
    const struct ps_coord_store *coord;
} ps_api_env_t;

/* The method of a gRPC path such as "/emberps.ParameterServer/Lookup" or
 * "/emberps.Coordinator/KvGet", or -1. */
int ps_api_method(const char *path, size_t len);
/* The full path of a method ("/emberps.ParameterServer/Lookup"). */
const char *ps_api_path(ps_api_method_t m);
/* Administrative methods (CreateTable, DropTable, Checkpoint, Restore): the admin token
 * applies. */
bool ps_api_is_admin(int method);

typedef struct ps_api_reply {
    int err;    /* 0, or the PC_E* code of the failure */
    int status; /* pc_err_to_grpc(err) (PS_ST_*); body only when PS_ST_OK */
    char msg[256];
    uint8_t *body; /* malloc'ed */
    size_t len;
} ps_api_reply_t;

/* admin: the caller presented the admin token (or none is set): KvSet of a key under
 * PS_COORD_CLUSTER_PREFIX needs it (PC_EAUTH otherwise). */
void ps_api_call(const ps_api_env_t *env, int method, const uint8_t *req, size_t len, bool admin,
                 ps_api_reply_t *out);
/* The rows (+ found) a Lookup/Pull reply may carry (env's max_reply): the reply limit, and
 * within one gRPC message of max_message bytes with room for the reply's own fields (their tags
 * and lengths), so that a reply that passes the check is never refused by gRPC's send limit. */
uint64_t ps_api_max_reply(uint64_t reply_limit, uint64_t max_message);
/* Make r a success carrying the packed response message m (any protobuf-c message), or
 * PC_ENOMEM. For other services' handlers (serve/sv_api.c). */
struct ProtobufCMessage;
void ps_api_reply_pack(ps_api_reply_t *r, const struct ProtobufCMessage *m);
void ps_api_reply_free(ps_api_reply_t *r);

/* Decoding a request of len bytes under a memory budget: protobuf-c allocates for every
 * repeated element and unknown field, an empty string or message costing tens of bytes for its
 * two encoded ones, so a request of the largest message size could take gigabytes. The
 * allocator gives up past PS_API_DECODE_FACTOR x len + 1 MiB (the unpack then fails: a
 * malformed request); what it gives is plain malloc, freed by free_unpacked(m, NULL). b lives
 * as long as the unpack call. */
#define PS_API_DECODE_FACTOR 4
typedef struct ps_api_budget {
    ProtobufCAllocator a;
    size_t left;
} ps_api_budget_t;
ProtobufCAllocator *ps_api_budget(ps_api_budget_t *b, size_t len);

/* Make r a failure: code err (negative), its gRPC status, and a message (printf format, cut to
 * fit). The transport uses it for the failures it finds itself (token, unknown path). */
void ps_api_fail(ps_api_reply_t *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
