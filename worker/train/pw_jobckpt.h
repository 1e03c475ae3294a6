/* pw_jobckpt.h: coordinated checkpoints of a distributed job, the worker side.
 *
 * At a step boundary where every push of the step is applied and no push of the next one has
 * been sent (the trainer holds the workers at barriers around it), the group's rank 0 asks every
 * server to write a checkpoint (gRPC Checkpoint) and writes DIR/step-<S>/ with
 *   dense.state  the dense state (weights, optimizer state, step count): pw_state_save
 *                (pw_model_io.h);
 *   manifest     text lines "emberps-job-checkpoint 1", "step S", "servers ID0 ID1 ..." (each
 *                server's checkpoint id, in cluster-map order), "positions L0 L1 ..." (lines of
 *                each data rank's share read through step S);
 * then DIR/LATEST ("S\n"); every file is written atomically (pc_fs_write_atomic), LATEST last,
 * so a crash leaves the previous checkpoint the latest. Of the step directories, the latest and
 * the `keep` - 1 before it stay (later ones, abandoned by a rollback or half-written, go). DIR
 * must be reachable by every worker (one machine, or a shared file system) for a rollback.
 *
 * Rolling a job back to it: start server i with --restore-id=IDi, every worker with
 * --resume=checkpoint; or, while the job runs (--on-server-loss=rollback), restore the running
 * servers (pw_jobckpt_restore_servers) and load every worker's state and position
 * (docs/training.md).
 *
 * Errors: PC_ENOTFOUND (no checkpoint), PC_ECORRUPT (a damaged file), PC_EDIM (a dense state of
 * another size: another model), PC_EIO, PC_EUNAVAIL / PC_ETIMEDOUT (a server did not answer).
 */
#ifndef PW_JOBCKPT_H
#define PW_JOBCKPT_H

#include <stddef.h>
#include <stdint.h>

#include "emberps/psgrpc.h"

#define PW_JOBCKPT_MAX_SERVERS 1024
#define PW_JOBCKPT_MAX_RANKS   4096

typedef struct pw_jobckpt {
    uint64_t step;
    size_t nservers, nranks;
    uint64_t servers[PW_JOBCKPT_MAX_SERVERS];
    uint64_t positions[PW_JOBCKPT_MAX_RANKS];
} pw_jobckpt_t;

/* Ask every server of `grpc` (comma-separated host:gRPC port, cluster-map order) to write a
 * checkpoint now; their ids go to ck->servers. sec (may be NULL: plaintext, no token) gives the
 * token and TLS files of the calls (psg_opts_t; its addr is not used). */
int pw_jobckpt_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms, pw_jobckpt_t *ck);

/* Have every server of `grpc` (as above) go back to its checkpoint of ck (gRPC Restore of
 * ck->servers[i], each call bounded by timeout_ms): a job rollback while the servers run.
 * PC_EINVAL (nothing restored) when the list and the checkpoint's servers differ in number; an
 * error after the first call may leave some servers restored and others not. */
int pw_jobckpt_restore_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms,
                               const pw_jobckpt_t *ck);

/* Write DIR/step-<ck->step>/ and LATEST; keep `keep` (>= 1) step directories (see above). */
int pw_jobckpt_write(const char *dir, const pw_jobckpt_t *ck, const float *state, size_t n,
                     int keep);

/* Read the latest checkpoint: its manifest into ck and its n-float dense state into state. */
int pw_jobckpt_read_latest(const char *dir, pw_jobckpt_t *ck, float *state, size_t n);

#endif
