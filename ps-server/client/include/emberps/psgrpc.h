/* emberps/psgrpc.h: unary calls to an EmberPS server's gRPC API (proto/emberps.proto) from C.
 *
 * The caller packs and unpacks the protobuf messages (protobuf-c or anything else); this client
 * moves bytes: it owns one channel, adds the token metadata ("x-emberps-token") and a deadline
 * to every call, and returns the gRPC status. Used by psctl; other languages generate stubs from
 * the .proto instead.
 *
 * Thread rule: a client may be used by several threads at once (gRPC channels are thread-safe).
 */
#ifndef EMBERPS_PSGRPC_H
#define EMBERPS_PSGRPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct psg psg_t;

/* A client of the server at addr ("host:port"); token may be NULL. No I/O happens yet. */
int psg_create(const char *addr, const char *token, uint32_t max_message, psg_t **out);
void psg_destroy(psg_t *c);

/* Call `path` ("/emberps.ParameterServer/Health") with request bytes; on status 0, *resp gets
 * the response bytes (malloc'ed, caller frees) and *resp_len their length. Returns the gRPC
 * status code (14 UNAVAILABLE when the server cannot be reached, 4 DEADLINE_EXCEEDED); msg
 * (may be NULL) receives the status message. */
int psg_call(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
             uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap);

/* A gRPC status as an EmberPS error (pc_error.h): 0, PC_EINVAL (INVALID_ARGUMENT), PC_ETIMEDOUT,
 * PC_ENOTFOUND, PC_EEXIST (ALREADY_EXISTS), PC_ETOOBIG (RESOURCE_EXHAUSTED), PC_EUNAVAIL,
 * PC_EAUTH (UNAUTHENTICATED), PC_EINTERNAL for the rest. */
int psg_error(int status);

#ifdef __cplusplus
}
#endif

#endif
