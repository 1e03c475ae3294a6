/* psgrpc.c: see emberps/psgrpc.h. gRPC C core client: one batch with every op of a unary call,
 * waited for on a per-call pluck queue.
 *
 * DESIGN: the channel's credentials (plaintext, or TLS from PEM files read once here) are fixed
 * at creation. gRPC reports a failed TLS handshake as UNAVAILABLE with the TLS library's words
 * in the status details; tls_failure() is the one place that recognises them and rewrites the
 * failure as PC_ETLS with a message naming the server and the cause. */
#include "emberps/psgrpc.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pc_grpc_log.h"
#include "pc_time.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEM_MAX (1u << 20)

struct psg {
    grpc_channel *ch;
    char token[256];
    char addr[256]; /* for messages */
    char ca[256];   /* what verifies the server: the CA file, or "the system's roots" */
    bool tls, has_cert;
};

static bool set(const char *s) {
    return s && s[0];
}

/* TLS credentials from the PEM files of o (read here, copied by gRPC). */
static int tls_credentials(const psg_opts_t *o, grpc_channel_credentials **out) {
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = set(o->tls_ca) ? pc_fs_read_all(o->tls_ca, PEM_MAX, &ca, NULL) : 0;
    if (!rc && set(o->tls_cert))
        rc = pc_fs_read_all(o->tls_cert, PEM_MAX, &cert, NULL);
    if (!rc && set(o->tls_key))
        rc = pc_fs_read_all(o->tls_key, PEM_MAX, &key, NULL);
    if (!rc) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
        rc = *out ? 0 : PC_EINVAL;
    }
    free(ca);
    free(cert);
    free(key);
    return rc;
}

/* A token gRPC can send as a metadata value: printable ASCII (a token file's CRLF, or UTF-8,
 * would fail every call with an empty message). */
static bool token_sendable(const char *t) {
    for (; t && *t; t++)
        if ((unsigned char)*t < 0x20 || (unsigned char)*t > 0x7e)
            return false;
    return true;
}

int psg_create(const psg_opts_t *o, psg_t **out) {
    if (!o || !o->addr || !out || (o->token && strlen(o->token) >= 256) ||
        !token_sendable(o->token) || set(o->tls_cert) != set(o->tls_key))
        return PC_EINVAL;
    psg_t *c = calloc(1, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    snprintf(c->token, sizeof c->token, "%s", o->token ? o->token : "");
    snprintf(c->addr, sizeof c->addr, "%s", o->addr);
    c->tls = o->tls || set(o->tls_ca) || set(o->tls_cert);
    c->has_cert = set(o->tls_cert);
    snprintf(c->ca, sizeof c->ca, "%s", set(o->tls_ca) ? o->tls_ca : "the system's roots");
    pc_grpc_log_route();
    grpc_init();
    grpc_channel_credentials *cr = NULL;
    int rc = c->tls ? tls_credentials(o, &cr) : 0;
    if (rc) {
        free(c);
        grpc_shutdown();
        return rc;
    }
    if (!cr)
        cr = grpc_insecure_credentials_create();
    const int max = (int)(o->max_message ? o->max_message : 64u << 20);
    grpc_arg args[3] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = max},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = max},
        {.type = GRPC_ARG_STRING,
         .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
         .value.string = (char *)o->tls_target},
    };
    grpc_channel_args ca = {set(o->tls_target) ? 3 : 2, args};
    c->ch = grpc_channel_create(o->addr, cr, &ca);
    grpc_channel_credentials_release(cr);
    *out = c;
    return 0;
}

void psg_destroy(psg_t *c) {
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    free(c);
    grpc_shutdown();
}

/* The code a finished call's status and trailing metadata name (pc_error.h: the one mapping). */
static int code_of(grpc_status_code status, const grpc_metadata_array *trail) {
    for (size_t i = 0; i < trail->count; i++) {
        const grpc_slice k = trail->metadata[i].key, v = trail->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) == sizeof PC_GRPC_ERROR_KEY - 1 &&
            memcmp(GRPC_SLICE_START_PTR(k), PC_GRPC_ERROR_KEY, sizeof PC_GRPC_ERROR_KEY - 1) == 0)
            return pc_err_from_grpc((int)status, (const char *)GRPC_SLICE_START_PTR(v),
                                    GRPC_SLICE_LENGTH(v));
    }
    return pc_err_from_grpc((int)status, NULL, 0);
}

/* Whether the words of an UNAVAILABLE status (details, then gRPC's error string) tell of a TLS
 * handshake that failed. If so: PC_ETLS, and msg names the server and the cause with the TLS
 * library's words; else PC_EUNAVAIL, msg as it was (with a hint for a plaintext client whose
 * connection was closed at once, as a TLS-only server does). gRPC 1.51's words: "Ssl handshake
 * failed: ... certificate verify failed" when the server's certificate does not verify; "Socket
 * closed" while connecting when the server rejects the client's certificate (or its absence)
 * after the handshake, or a plaintext client; "Peer name N is not in peer certificate" when the
 * certificate verifies but names another host. */
static int tls_failure(const psg_t *c, grpc_slice details, const char *err, char *msg,
                       size_t msgcap) {
    char words[1024], scratch[1024];
    snprintf(words, sizeof words, "%.*s\n%s", (int)GRPC_SLICE_LENGTH(details),
             (const char *)GRPC_SLICE_START_PTR(details), err ? err : "");
    const bool connecting = strstr(words, "failed to connect") != NULL;
    const bool closed = connecting && strstr(words, "Socket closed") != NULL;
    const char *ssl = strstr(words, "Ssl handshake failed");
    if (!msg || !msgcap) /* the code is still decided (the text goes aside, not over words) */
        msg = scratch, msgcap = sizeof scratch, scratch[0] = '\0';
    if (!c->tls) {
        if (closed && strlen(msg) + 80 < msgcap)
            strcat(msg, " (a TLS-only server closes plaintext connections: give its CA, tls_ca)");
        return PC_EUNAVAIL;
    }
    if (ssl) {
        const char *lib = strstr(ssl, "SSL routines::");
        char why[160];
        snprintf(why, sizeof why, "%.*s", (int)strcspn(lib ? lib + 14 : ssl, "|{\n"),
                 lib ? lib + 14 : ssl);
        if (strstr(ssl, "certificate verify failed"))
            snprintf(msg, msgcap,
                     "server %s: TLS handshake failed: the server's certificate did not verify "
                     "against %s (%s)",
                     c->addr, c->ca, why);
        else
            snprintf(msg, msgcap, "server %s: TLS handshake failed: %s", c->addr, why);
        return PC_ETLS;
    }
    const char *peer = strstr(words, "Peer name ");
    if (peer && strstr(peer, "is not in peer certificate")) {
        const char *name = peer + 10;
        snprintf(msg, msgcap,
                 "server %s: TLS handshake failed: the server's certificate does not name %.*s",
                 c->addr, (int)strcspn(name, " "), name);
        return PC_ETLS;
    }
    if (closed) {
        snprintf(msg, msgcap,
                 "server %s closed the connection in the TLS handshake: %s (or it does not serve "
                 "TLS)",
                 c->addr,
                 c->has_cert ? "it did not accept this client's certificate"
                             : "it requires a client certificate (tls_cert, tls_key)");
        return PC_ETLS;
    }
    return PC_EUNAVAIL;
}

int psg_request(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
                uint8_t **resp, size_t *resp_len, int *status_out, char *msg, size_t msgcap) {
    *resp = NULL;
    *resp_len = 0;
    if (msg && msgcap)
        msg[0] = '\0';
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec dl =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice method = grpc_slice_from_static_string(path);
    grpc_call *call =
        grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL, dl, NULL);
    grpc_slice body = grpc_slice_from_copied_buffer((const char *)req, len);
    grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata md = {.key = grpc_slice_from_static_string("x-emberps-token"),
                        .value = grpc_slice_from_copied_string(c->token)};
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *in = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *err = NULL;
    int local = 0; /* a failure on this side, after which the status says less */
    grpc_op op[6];
    memset(op, 0, sizeof op);
    op[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    op[0].data.send_initial_metadata.count = c->token[0] ? 1 : 0;
    op[0].data.send_initial_metadata.metadata = &md;
    op[1].op = GRPC_OP_SEND_MESSAGE;
    op[1].data.send_message.send_message = out;
    op[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    op[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    op[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    op[4].op = GRPC_OP_RECV_MESSAGE;
    op[4].data.recv_message.recv_message = &in;
    op[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    op[5].data.recv_status_on_client.status = &status;
    op[5].data.recv_status_on_client.status_details = &details;
    op[5].data.recv_status_on_client.error_string = &err;
    grpc_call_error e = grpc_call_start_batch(call, op, 6, (void *)1, NULL);
    if (e == GRPC_CALL_OK) {
        grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    } else {
        status = GRPC_STATUS_INTERNAL;
        local = PC_EINTERNAL;
    }
    if (status == GRPC_STATUS_OK && in) {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, in)) {
            grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
            *resp_len = GRPC_SLICE_LENGTH(s);
            *resp = malloc(*resp_len + 1);
            if (*resp) {
                memcpy(*resp, GRPC_SLICE_START_PTR(s), *resp_len);
            } else {
                status = GRPC_STATUS_RESOURCE_EXHAUSTED;
                local = PC_ENOMEM;
            }
            grpc_slice_unref(s);
            grpc_byte_buffer_reader_destroy(&rd);
        }
    }
    if (msg && msgcap)
        snprintf(msg, msgcap, "%.*s", (int)GRPC_SLICE_LENGTH(details),
                 (const char *)GRPC_SLICE_START_PTR(details));
    int rc = local ? local : code_of(status, &trail_md);
    if (rc == PC_EUNAVAIL)
        rc = tls_failure(c, details, err, msg, msgcap);
    grpc_slice_unref(details);
    gpr_free((void *)err);
    grpc_slice_unref(md.value);
    if (in)
        grpc_byte_buffer_destroy(in);
    grpc_byte_buffer_destroy(out);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    if (status_out)
        *status_out = (int)status;
    return rc;
}

int psg_request_busy(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
                     uint8_t **resp, size_t *resp_len, int *status, char *msg, size_t msgcap,
                     psg_busy_fn waiting, void *ctx) {
    char own[256]; /* the status message, to tell a busy answer, where the caller keeps none */
    char *m = msg && msgcap ? msg : own;
    const size_t cap = msg && msgcap ? msgcap : sizeof own;
    const uint64_t t0 = pc_time_mono_ns();
    int pause_ms = 50, left = timeout_ms;
    for (;;) {
        const int rc = psg_request(c, path, req, len, left, resp, resp_len, status, m, cap);
        left = timeout_ms - (int)(pc_time_sec_since(t0) * 1000);
        if (rc != PC_EUNAVAIL || strncmp(m, PSG_BUSY, strlen(PSG_BUSY)) != 0 || left <= pause_ms)
            return rc;
        if (waiting && pause_ms == 50)
            waiting(ctx, path, left);
        pc_time_sleep_ms(pause_ms);
        left -= pause_ms;
        pause_ms = pause_ms < 1000 ? pause_ms * 2 : 1000;
    }
}

int psg_call(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
             uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap) {
    int status;
    psg_request(c, path, req, len, timeout_ms, resp, resp_len, &status, msg, msgcap);
    return status;
}
