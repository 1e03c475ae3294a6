/* psctl_exit.h: what every psctl command shares: the exit status of a failed call (docs/server.md
 * "psctl"): 3 when the call did not reach the server's API (unreachable, TLS), 4 when no answer
 * came before the deadline (the call may have run: a checkpoint, a create; look before retrying),
 * 1 when the server answered with a refusal (a wrong token, a bad request, ...); a call that asks
 * a busy server again; the reading of a number argument; and 64-bit counts in --json output,
 * exact. */
#ifndef PSCTL_EXIT_H
#define PSCTL_EXIT_H

#include "emberps/psgrpc.h"
#include "pc_error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int psctl_exit_of(int rc) {
    return rc == PC_ETIMEDOUT ? 4 : rc == PC_EUNAVAIL || rc == PC_ETLS ? 3 : 1;
}

/* What psctl says on stderr when a busy server is asked again (psg_request_busy). */
static inline void psctl_said_busy(void *ctx, const char *path, int left_ms) {
    (void)ctx;
    fprintf(stderr,
            "psctl: %s: the server is busy with other administrative calls: asking again for up "
            "to %d ms\n",
            path, left_ms);
}

/* psg_request, asked again while the server answers that it is busy with other administrative
 * calls (PSG_BUSY: none of the call ran), for up to timeout_ms in all (said once on stderr). */
static inline int psctl_request(psg_t *c, const char *path, const uint8_t *req, size_t len,
                                int timeout_ms, uint8_t **resp, size_t *resp_len, int *st,
                                char *msg, size_t cap) {
    return psg_request_busy(c, path, req, len, timeout_ms, resp, resp_len, st, msg, cap,
                            psctl_said_busy, NULL);
}

/* A decimal number argument (a key, an id, a step): digits only, no sign, no space, no junk,
 * within 64 bits. */
static inline bool psctl_number(const char *s, uint64_t *v) {
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return s[0] >= '0' && s[0] <= '9' && !*end && !errno;
}

/* o[k] = v, a JSON number with every digit (through a double, positions and times past 2^53
 * printed as 1.7960049524059808e+18). */
static inline void psctl_json_u64(cJSON *o, const char *k, uint64_t v) {
    char digits[24];
    snprintf(digits, sizeof digits, "%" PRIu64, v);
    cJSON_AddRawToObject(o, k, digits);
}

#endif
