/* pw_cuda_nccl.cu: the GPU backend's collectives over device memory (pw_dcoll_ops_t), on NCCL.
 *
 * DESIGN
 * - A communicator per group generation, non-blocking, so every call can be bounded: the unique
 *   id comes from rank 0 through the group's rendezvous store (the coordinator), initialization
 *   and each allreduce are polled until done, failed (a peer reported an error) or past the
 *   timeout, and then aborted: the worker re-forms the group as it does after a Gloo failure.
 * - Allreduces run on the communicator's own stream; the trainer completes the buffer (sync)
 *   before it hands it over.
 *
 * Thread rule: a communicator is used by one thread at a time and sets its device on it.
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "pc_error.h"
#include "pw_backend.h"
#include "pw_coll.h"
}
#include "pw_cuda.h"

namespace {

/* ---- NCCL: collectives over device memory ---- */

struct nccl_coll {
    ncclComm_t comm;
    cudaStream_t stream;
    int dev, timeout_ms;
    void (*log)(const char *msg);
    pthread_mutex_t *mem_mu; /* the backend's (pw_cuda::mem_hold) */
};

/* A line to the worker's error log (the module has no logger of its own). */
__attribute__((format(printf, 2, 3))) void report(void (*log)(const char *), const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log(msg);
}

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void pause_100us() {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, nullptr);
}

/* NCCL's result as the project's code: errors a peer or the network caused can heal by
 * re-forming the group; the others are fatal to the job. */
int nccl_rc(ncclResult_t r) {
    switch (r) {
        case ncclSuccess:
            return 0;
        case ncclRemoteError:
        case ncclSystemError: /* sockets: a peer died during the bootstrap or a call */
            return PC_EUNAVAIL;
        case ncclInvalidArgument:
        case ncclInvalidUsage:
            return PC_EINVAL;
        default: /* internal and CUDA errors */
            return PC_EIO;
    }
}

/* Wait until the communicator's pending work is done (and, with `stream`, the stream too), it
 * failed, or the timeout passed; on failure the communicator is aborted. */
int nccl_wait(nccl_coll *c, const char *what, bool stream) {
    const double deadline = now_s() + c->timeout_ms / 1000.0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r == ncclSuccess)
            r = st;
        if (r != ncclSuccess && r != ncclInProgress) {
            report(c->log, "nccl: %s: %s (%s)", what, ncclGetErrorString(r),
                   ncclGetLastError(c->comm));
            ncclCommAbort(c->comm);
            c->comm = nullptr;
            return nccl_rc(r);
        }
        if (r == ncclSuccess) {
            const cudaError_t e = stream ? cudaStreamQuery(c->stream) : cudaSuccess;
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady) {
                report(c->log, "nccl: %s: %s", what, cudaGetErrorString(e));
                ncclCommAbort(c->comm);
                c->comm = nullptr;
                return PC_EIO;
            }
        }
        if (now_s() > deadline) {
            report(c->log, "nccl: %s: no progress within %d ms (a peer stopped?)", what,
                   c->timeout_ms);
            ncclCommAbort(c->comm);
            c->comm = nullptr;
            return PC_ETIMEDOUT;
        }
        pause_100us();
    }
}

void nccl_destroy(pw_dcoll_t *dc) {
    nccl_coll *c = reinterpret_cast<nccl_coll *>(dc);
    if (!c)
        return;
    if (c->comm) {
        cudaSetDevice(c->dev);
        ncclCommAbort(c->comm); /* frees it without waiting for peers that may be gone */
    }
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

int nccl_create(pw_backend_t *be, const struct pw_kv *kv, const char *prefix, int rank, int size,
                int timeout_ms, pw_dcoll_t **out) {
    const pw_cuda::device_info b = pw_cuda::info(be);
    char key[512];
    snprintf(key, sizeof key, "%s/id", prefix);
    ncclUniqueId id;
    ncclResult_t r;
    int rc;
    if (rank == 0) { /* rank 0 hands out the id of this generation */
        if ((r = ncclGetUniqueId(&id)) != ncclSuccess) {
            report(b.log, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
            return nccl_rc(r);
        }
        if ((rc = kv->set(kv->ctx, key, &id, sizeof id)))
            return rc;
    } else {
        const double deadline = now_s() + timeout_ms / 1000.0;
        for (;;) {
            void *v = nullptr;
            size_t len = 0;
            rc = kv->get(kv->ctx, key, &v, &len);
            if (rc == 0 && len == sizeof id) {
                memcpy(&id, v, sizeof id);
                free(v);
                break;
            }
            free(v);
            if (rc == 0) {
                report(b.log, "nccl: %s holds %zu bytes, not a unique id", key, len);
                return PC_ECORRUPT;
            }
            if (rc != PC_ENOTFOUND)
                return rc;
            if (now_s() > deadline)
                return PC_ETIMEDOUT;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, nullptr);
        }
    }
    nccl_coll *c = static_cast<nccl_coll *>(calloc(1, sizeof *c));
    if (!c)
        return PC_ENOMEM;
    c->dev = b.dev;
    c->timeout_ms = timeout_ms;
    c->log = b.log;
    c->mem_mu = b.mem_mu;
    cudaError_t e = cudaSetDevice(c->dev);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not the backend's sticky error */
        report(b.log, "nccl: device %d: its stream: %s", c->dev, cudaGetErrorString(e));
        free(c);
        return PC_EIO;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&c->comm, size, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        report(c->log, "nccl: ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        if (c->comm)
            ncclCommAbort(c->comm);
        c->comm = nullptr;
        nccl_destroy(reinterpret_cast<pw_dcoll_t *>(c));
        return nccl_rc(r);
    }
    if ((rc = nccl_wait(c, "forming the communicator", false))) {
        nccl_destroy(reinterpret_cast<pw_dcoll_t *>(c));
        return rc;
    }
    *out = reinterpret_cast<pw_dcoll_t *>(c);
    return 0;
}

int nccl_allreduce_sum(pw_dcoll_t *dc, float *buf, size_t n) {
    nccl_coll *c = reinterpret_cast<nccl_coll *>(dc);
    if (!c->comm)
        return PC_ECANCELED; /* aborted before: the group re-forms */
    if (!n)
        return 0;
    const pw_cuda::mem_hold hold(c->mem_mu); /* no allocation of the backend meanwhile */
    const cudaError_t e = cudaSetDevice(c->dev);
    if (e != cudaSuccess) { /* the device lost: said as itself, not as NCCL's later error */
        (void)cudaGetLastError();
        report(c->log, "nccl: cudaSetDevice(%d): %s", c->dev, cudaGetErrorString(e));
        ncclCommAbort(c->comm);
        c->comm = nullptr;
        return PC_EIO;
    }
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, c->stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        report(c->log, "nccl: ncclAllReduce: %s", ncclGetErrorString(r));
        ncclCommAbort(c->comm);
        c->comm = nullptr;
        return nccl_rc(r);
    }
    return nccl_wait(c, "allreduce", true);
}

} // namespace

const pw_dcoll_ops_t pw_cuda::nccl_ops = {nccl_create, nccl_allreduce_sum, nccl_destroy};
