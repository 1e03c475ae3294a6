/* psctl_serve.h: `psctl --server=HOST:PORT serve ...`: the commands of a ps-serve replica
 * (proto/emberps.proto, service emberps.Serving; docs/serving.md).
 *
 *   serve status             the model served, its version, pinned or live, every source's
 *                            state and lag, predictions, swaps, refusals
 *   serve versions           the versions the replica can load (the job's checkpoints)
 *   serve load STEP          pin version STEP (0: the newest)
 *   serve rollback [STEP]    pin STEP, or the version before the one served now (before the
 *                            newest when following)
 *   serve follow             back to live rows and published models
 *   serve predict FILE [N]   score the first N (default 8) lines of FILE (the training stream's
 *                            format) and print each score with the model version and the
 *                            sparse watermark of the reply
 *
 * DESIGN: a separate file from psctl.c's server commands because the paths are another
 * service's; calls go through the same psg client and print the same way (human text, or one
 * JSON object with --json).
 */
#ifndef PSCTL_SERVE_H
#define PSCTL_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "emberps/psgrpc.h"

typedef struct psctl_serve_opts {
    psg_t *c; /* borrowed */
    bool json;
    int timeout_ms;
    const char *model; /* predict: the model's name ("" the one served) */
} psctl_serve_opts_t;

/* Run `serve ARGS` (args[0] is the subcommand). Returns psctl's exit status: 0 done, 1 refused
 * (said on stderr), 2 bad usage, 3 unreachable. */
int psctl_serve(const psctl_serve_opts_t *o, int nargs, char **args);

#endif
