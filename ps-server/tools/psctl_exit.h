/* psctl_exit.h: psctl's exit status for a failed call (docs/server.md "psctl"): 3 when the call
 * did not reach the server's API (unreachable, no answer in time, TLS), 1 when the server
 * answered with a refusal (a wrong token, a bad request, ...). Shared by every psctl command. */
#ifndef PSCTL_EXIT_H
#define PSCTL_EXIT_H

#include "pc_error.h"

static inline int psctl_exit_of(int rc) {
    return rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT || rc == PC_ETLS ? 3 : 1;
}

#endif
