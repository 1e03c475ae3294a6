/* sv_api.h: ps-serve's gRPC service (proto/emberps.proto, service emberps.Serving), served by
 * the same transport as ps-server's API (ps_grpc.h) through its table of functions.
 *
 * Predict turns a request's samples into a batch exactly as ps-worker's reader does (lines in
 * the model card's format through pw_parse_line; or samples with their keys), looks the rows up
 * in the served state, scores them with the served model and stamps the reply with the model's
 * version and the sparse watermark. ParameterServer/Lookup and Health answer from the replica;
 * the ParameterServer methods that write are refused with PC_EREADONLY.
 *
 * Bad input (docs/serving.md, "Errors"): PC_EINVAL no samples, both forms, a field count or
 * value count that does not match the keys, a field beyond the model's, NaN or Inf in dense
 * values or key values; PC_EDIM a dense width that is not the model's; PC_EPARSE a line that
 * does not parse (the reply names the sample); PC_ETOOBIG more samples than max_batch or keys
 * than max_keys; PC_ENOTFOUND an unknown model name or table; PC_EUNAVAIL no dense model yet.
 * Each is the reply's status; the daemon goes on.
 *
 * Thread rule: calls run concurrently (sv_serve.h is thread-safe).
 */
#ifndef SV_API_H
#define SV_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_api.h"
#include "sv_serve.h"

typedef struct sv_api_env {
    sv_serve_t *serve;
    uint32_t max_batch;  /* samples per Predict */
    uint32_t max_keys;   /* keys per Lookup, and features per Predict */
    uint64_t max_reply;  /* bytes of rows a Lookup may return (within a message) */
    uint64_t max_gather; /* bytes of rows a Predict gathers (max_reply_bytes; 0: max_reply) */
    uint64_t start_ns;
} sv_api_env_t;

/* The method index of a path (Serving's, or ParameterServer's), -1 when neither. */
int sv_api_method(const char *path, size_t len);
bool sv_api_is_admin(int method);
/* ps_grpc_service_t.ready: "emberps.Serving" is ready once a dense model is served (Predict
 * would answer PC_EUNAVAIL before: a readiness probe keeps traffic away until then); "" (the
 * process answers: a liveness probe) and ParameterServer (Lookup) always. env: sv_api_env_t. */
bool sv_api_ready(void *env, const char *service);
/* ps_grpc_service_t.call: env is the sv_api_env_t. */
void sv_api_call(void *env, int method, const uint8_t *req, size_t len, bool admin,
                 ps_api_reply_t *out);

#endif
