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
 * DESIGN (TLS): with tls_ca (or tls) the channel speaks TLS and verifies the server's
 * certificate against that CA (the system's roots without one) and the host of addr (or
 * tls_target); tls_cert and tls_key present a client certificate to servers that ask for one.
 * A failed handshake is translated here, once, from gRPC's UNAVAILABLE into PC_ETLS with a
 * message that names the server and what did not verify ("server 127.0.0.1:7500: TLS: its
 * certificate did not verify against ca.pem"); PEM files are read in psg_create, so a
 * missing file fails there, not at the first call.
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

typedef struct psg_opts {
    const char *addr;       /* "host:port" of the server (required) */
    const char *token;      /* sent as x-emberps-token; NULL/"": none */
    uint32_t max_message;   /* largest message either way, bytes; 0: 64 MiB */
    int tls;                /* non-zero: TLS even without tls_ca (the system's roots verify) */
    const char *tls_ca;     /* PEM file of the CA the server's certificate chains to: TLS on */
    const char *tls_cert;   /* PEM file of a client certificate (servers asking for one) */
    const char *tls_key;    /* PEM file of its private key (with tls_cert) */
    const char *tls_target; /* name the certificate must carry instead of addr's host; tests */
} psg_opts_t;

/* A client of the server o->addr. Strings are copied or read during the call (borrowed). No
 * network I/O happens yet. Returns 0, PC_EINVAL (no addr, a token over 255 bytes or with a byte
 * outside printable ASCII (a CR from a token file), tls_cert
 * without tls_key or the other way round), PC_ENOMEM, or pc_fs_read_all's code for a PEM file
 * that cannot be read (PC_ENOTFOUND: no such file). */
int psg_create(const psg_opts_t *o, psg_t **out);
void psg_destroy(psg_t *c);

/* Call `path` ("/emberps.ParameterServer/Health") with request bytes. Returns 0 or the error:
 * the code the server named, or for a status without a name (another server, or one gRPC made:
 * PC_EUNAVAIL when the server cannot be reached, PC_ETIMEDOUT at the deadline, PC_ETOOBIG for a
 * message over the size limit, PC_ETLS when the TLS handshake failed: msg says why, naming the
 * server) the code its status stands for; PC_ENOMEM or PC_EINTERNAL for a
 * failure on this side. On 0, *resp gets the response bytes (malloc'ed, caller frees) and
 * *resp_len their length. *status (may be NULL) receives the gRPC status code, msg (may be
 * NULL) the status message. */
int psg_request(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
                uint8_t **resp, size_t *resp_len, int *status, char *msg, size_t msgcap);

/* How a server's status message starts when it refused an administrative call at once because
 * its other administrative calls hold every handler thread but one (PC_EUNAVAIL; none of the
 * call ran: asking again is safe). */
#define PSG_BUSY "busy: "

/* Told once, before the first pause, that psg_request_busy asks again (left_ms: for up to). */
typedef void (*psg_busy_fn)(void *ctx, const char *path, int left_ms);

/* psg_request, asked again while the server answers PSG_BUSY, pausing 50 ms doubling to 1 s,
 * for up to timeout_ms in all (each attempt's deadline is the time left); waiting (may be NULL)
 * is told once. The psctl commands and the workers' job checkpoints call through it. */
int psg_request_busy(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
                     uint8_t **resp, size_t *resp_len, int *status, char *msg, size_t msgcap,
                     psg_busy_fn waiting, void *ctx);

/* psg_request returning the gRPC status code instead (14 UNAVAILABLE when the server cannot be
 * reached, 4 DEADLINE_EXCEEDED), for callers that look at statuses. */
int psg_call(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
             uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap);

#ifdef __cplusplus
}
#endif

#endif
