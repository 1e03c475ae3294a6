/* pw_cuda.h: what the CUDA module's two files share (not a public header): the backend's
 * device and log for the NCCL part, and the NCCL part's table for the backend. Hidden: the module
 * exports only pw_cuda_backend_open. */
#ifndef PW_CUDA_H
#define PW_CUDA_H

extern "C" {
#include "pw_backend.h"
}

namespace pw_cuda {

struct device_info {
    int dev;                      /* the CUDA device */
    void (*log)(const char *msg); /* the worker's error log */
};

/* The device and log of a backend opened by pw_cuda_backend_open (pw_backend_cuda.cu). */
__attribute__((visibility("hidden"))) device_info info(pw_backend_t *be);

/* Collectives over device memory on NCCL (pw_cuda_nccl.cu). */
__attribute__((visibility("hidden"))) extern const pw_dcoll_ops_t nccl_ops;

} // namespace pw_cuda

#endif
