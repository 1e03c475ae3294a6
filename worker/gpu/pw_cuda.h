/* pw_cuda.h: what the CUDA module's two files share (not a public header): the backend's
 * device, log and memory lock for the NCCL part, and the NCCL part's table for the backend.
 * Hidden: the module exports only pw_cuda_backend_open. */
#ifndef PW_CUDA_H
#define PW_CUDA_H

#include <pthread.h>

extern "C" {
#include "pw_backend.h"
}

namespace pw_cuda {

struct device_info {
    int dev;                      /* the CUDA device */
    void (*log)(const char *msg); /* the worker's error log */
    pthread_mutex_t *mem_mu;      /* the backend's memory lock (mem_hold) */
};

/* Held while a backend allocates or frees device or pinned host memory (the trainer's thread)
 * and while its NCCL communicator runs a collective (the scheduler's thread): never at once.
 * cudaFree and cudaFreeHost wait for the device, and a collective in flight waits for its peers,
 * whose collective may wait the same way: NCCL documents that hang. An allocation then waits for
 * the collective to end (they grow only when a batch is the largest yet). */
class mem_hold {
  public:
    explicit mem_hold(pthread_mutex_t *mu) : mu_(mu) { pthread_mutex_lock(mu_); }
    ~mem_hold() { pthread_mutex_unlock(mu_); }
    mem_hold(const mem_hold &) = delete;
    mem_hold &operator=(const mem_hold &) = delete;

  private:
    pthread_mutex_t *mu_;
};

/* The device and log of a backend opened by pw_cuda_backend_open (pw_backend_cuda.cu). */
__attribute__((visibility("hidden"))) device_info info(pw_backend_t *be);

/* Collectives over device memory on NCCL (pw_cuda_nccl.cu). */
__attribute__((visibility("hidden"))) extern const pw_dcoll_ops_t nccl_ops;

} // namespace pw_cuda

#endif
