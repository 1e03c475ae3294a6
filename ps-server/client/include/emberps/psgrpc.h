/* emberps/psgrpc.h: unary calls to an EmberPS server's gRPC API (proto/emberps.proto) from C.
 *
 * The caller packs and unpacks the protobuf messages (protobuf-c or anything else); this client
 * moves bytes: it owns one channel, adds the token metadata ("x-emberps-token") and a deadline
 * to every call, and returns the server's error code (pc_error.h) exactly: an EmberPS server
 * sends the code's name as trailing metadata "emberps-error" beside the gRPC status (several
 * codes share a status), and the client turns both back into the code (pc_err_from_grpc). Used
 * by psctl, the coordinator client and the job checkpoints; other languages generate stubs from
 * the .proto instead (and may read "emberps-error" the same way).
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

/* Call `path` ("/emberps.ParameterServer/Health") with request bytes. Returns 0 or the error:
 * the code the server named, or for a status without a name (another server, or one gRPC made:
 * PC_EUNAVAIL when the server cannot be reached, PC_ETIMEDOUT at the deadline, PC_ETOOBIG for a
 * message over the size limit) the code its status stands for; PC_ENOMEM or PC_EINTERNAL for a
 * failure on this side. On 0, *resp gets the response bytes (malloc'ed, caller frees) and
 * *resp_len their length. *status (may be NULL) receives the gRPC status code, msg (may be
 * NULL) the status message. */
int psg_request(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
                uint8_t **resp, size_t *resp_len, int *status, char *msg, size_t msgcap);

/* psg_request returning the gRPC status code instead (14 UNAVAILABLE when the server cannot be
 * reached, 4 DEADLINE_EXCEEDED), for callers that look at statuses. */
int psg_call(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
             uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap);

#ifdef __cplusplus
}
#endif

#endif
