/* pw_backend.c: choosing a backend by device name (pw_backend_open).
 *
 * DESIGN: the GPU backend lives in a separately built module, libember_cuda.so, linked to
 * cudart, cuBLAS and NCCL (which load without a GPU driver) and never to libcuda, so the worker
 * binary itself has no CUDA dependency: it starts everywhere and loads the module only when
 * asked. The module is looked up next to the executable, in ../lib relative to it, then on the
 * loader's path; it is never dlclose'd (CUDA's libraries do not unload cleanly).
 */
#include "pw_backend.h"

#include "pc_error.h"
#include "pc_log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_MODULE "libember_cuda.so"

int pw__backend_checked_open(pw_backend_t **out);
const char *pw__blas_fell(void);

/* dlopen the CUDA module; NULL with the loader's reasons in why. */
static void *load_module(char *why, size_t why_len) {
    char exe[4096], path[4200], errs[1024] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *dir = ".";
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            dir = exe;
        }
    }
    const char *const where[] = {"%s/" CUDA_MODULE, "%s/../lib/" CUDA_MODULE, CUDA_MODULE};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        snprintf(path, sizeof path, where[i], dir);
        if (i + 1 < sizeof where / sizeof where[0] && access(path, F_OK) != 0)
            continue; /* not there: no loader message worth keeping */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        const char *e = dlerror();
        const size_t used = strlen(errs);
        if (used + 3 < sizeof errs) /* keep what fits: the loader's first reasons matter most */
            snprintf(errs + used, sizeof errs - used, "%s%.900s", used ? "; " : "", e ? e : path);
    }
    snprintf(why, why_len, "the CUDA module did not load (%s)", errs);
    return NULL;
}

static void module_log(const char *msg) {
    PC_ERROR("%s", msg);
}

/* The GPU backend on device `dev`; PC_EUNAVAIL with the reason in why. */
static int open_cuda(int dev, pw_backend_t **out, char *why, size_t why_len) {
    void *h = load_module(why, why_len);
    if (!h)
        return PC_EUNAVAIL;
    pw_cuda_open_fn fn;
    *(void **)&fn = dlsym(h, "pw_cuda_backend_open");
    if (!fn) {
        snprintf(why, why_len, "%s has no pw_cuda_backend_open", CUDA_MODULE);
        return PC_EUNAVAIL;
    }
    int rc = fn(dev, module_log, out, why, why_len);
    if (rc)
        return rc;
    if ((*out)->abi != PW_BACKEND_ABI) {
        snprintf(why, why_len, "%s speaks backend ABI %d, this worker %d (rebuild both)",
                 CUDA_MODULE, (*out)->abi, PW_BACKEND_ABI);
        (*out)->close(*out);
        *out = NULL;
        return PC_EUNAVAIL;
    }
    return 0;
}

/* The CPU backend's line for pw_backend_open: why it was chosen, and OpenBLAS's kernels. */
static void cpu_why(char *why, size_t why_len, const char *how) {
    const char *fell = pw__blas_fell();
    const int threads = pw_blas_threads(-1);
    snprintf(why, why_len, "%s (%s; OpenBLAS %s kernels%s%s%s, %d thread%s)",
             pw_backend_cpu()->name, how, pw_blas_core(), fell[0] ? ", chosen over the " : "", fell,
             fell[0] ? " it fell back to on this CPU" : "", threads, threads == 1 ? "" : "s");
}

int pw_backend_open(const char *device, pw_backend_t **out, char *why, size_t why_len) {
    char scratch[8];
    if (!why || !why_len) {
        why = scratch;
        why_len = sizeof scratch;
    }
    why[0] = 0;
    *out = NULL;
    if (!device || strcmp(device, "cpu") == 0) {
        *out = pw_backend_cpu();
        cpu_why(why, why_len, "--device cpu");
        return 0;
    }
    if (strcmp(device, "cpu:checked") == 0) {
        int rc = pw__backend_checked_open(out);
        if (!rc)
            snprintf(why, why_len, "cpu:checked (device memory guarded; slow, for tests)");
        return rc;
    }
    int dev = 0;
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':')) {
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || v < 0 || v > 1023) {
                snprintf(why, why_len, "bad device \"%s\" (cuda:N, N a GPU index)", device);
                return PC_EINVAL;
            }
            dev = (int)v;
        }
        char reason[512];
        int rc = open_cuda(dev, out, reason, sizeof reason);
        if (rc)
            snprintf(why, why_len, "cannot use %s: %s", device, reason);
        else
            snprintf(why, why_len, "%s (--device %s)", (*out)->name, device);
        return rc;
    }
    if (strcmp(device, "auto") == 0) {
        char reason[512];
        if (open_cuda(0, out, reason, sizeof reason) == 0) {
            snprintf(why, why_len, "%s (--device auto: a GPU is present)", (*out)->name);
            return 0;
        }
        *out = pw_backend_cpu();
        char how[560];
        snprintf(how, sizeof how, "--device auto: no GPU backend: %s", reason);
        cpu_why(why, why_len, how);
        return 0;
    }
    snprintf(why, why_len, "unknown device \"%s\" (auto, cpu, cuda, cuda:N)", device);
    return PC_EINVAL;
}

void pw_backend_close(pw_backend_t *be) {
    if (be)
        be->close(be);
}
