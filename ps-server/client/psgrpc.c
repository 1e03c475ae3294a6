/* psgrpc.c: see emberps/psgrpc.h. gRPC C core client: one batch with every op of a unary call,
 * waited for on a per-call pluck queue. */
#include "emberps/psgrpc.h"

#include "pc_error.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct psg {
    grpc_channel *ch;
    char token[256];
};

int psg_create(const char *addr, const char *token, uint32_t max_message, psg_t **out) {
    if (!addr || !out || (token && strlen(token) >= 256))
        return -1;
    grpc_init();
    psg_t *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_shutdown();
        return -2;
    }
    snprintf(c->token, sizeof c->token, "%s", token ? token : "");
    grpc_arg args[2] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)(max_message ? max_message : 64u << 20)},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)(max_message ? max_message : 64u << 20)},
    };
    grpc_channel_args ca = {2, args};
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(addr, cr, &ca);
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
    const int rc = local ? local : code_of(status, &trail_md);
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

int psg_call(psg_t *c, const char *path, const uint8_t *req, size_t len, int timeout_ms,
             uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap) {
    int status;
    psg_request(c, path, req, len, timeout_ms, resp, resp_len, &status, msg, msgcap);
    return status;
}
