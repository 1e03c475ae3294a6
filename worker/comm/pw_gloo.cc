// pw_gloo.cc: pw_coll.h over Gloo (TCP transport). Exceptions never cross into C: every entry
// point catches them, logs the message and returns an EmberPS error code.
#include "pw_coll.h"

extern "C" {
#include "pc_error.h"
#include "pc_log.h"
}

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

// A rendezvous key that never came (this Gloo snapshot has no timeout exception of its own).
struct RendezvousTimeout : public std::runtime_error {
    explicit RendezvousTimeout(const std::string &m) : std::runtime_error(m) {}
};

// The store's own failure (its EmberPS code: a full coordinator is PC_EFULL, not a peer gone).
struct StoreError : public std::runtime_error {
    StoreError(const std::string &m, int code) : std::runtime_error(m), rc(code) {}
    int rc;
};

// Gloo's Store over the C callbacks; wait polls get (the coordinator never blocks a call). Each
// key is waited for up to the timeout: a formation fails once a member makes no progress for it
// (members started apart each wait for the next from the one before).
class KvStore : public gloo::rendezvous::Store {
  public:
    KvStore(const pw_kv_t &kv, std::chrono::milliseconds timeout) : kv_(kv), timeout_(timeout) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        int rc = kv_.set(kv_.ctx, key.c_str(), data.data(), data.size());
        if (rc)
            throw StoreError("rendezvous set " + key + ": " + pc_strerror(rc), rc);
    }

    std::vector<char> get(const std::string &key) override { return fetch(key, timeout_); }

    void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }

    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override {
        const auto end = std::chrono::steady_clock::now() + timeout;
        for (const auto &k : keys)
            fetch(k, std::chrono::duration_cast<std::chrono::milliseconds>(
                         end - std::chrono::steady_clock::now()));
    }

  private:
    // The value of key, polling until it is there or the timeout passed.
    std::vector<char> fetch(const std::string &key, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        for (int sleep_ms = 1;; sleep_ms = sleep_ms < 20 ? 2 * sleep_ms : 20) {
            void *v = nullptr;
            size_t n = 0;
            int rc = kv_.get(kv_.ctx, key.c_str(), &v, &n);
            if (rc == 0) {
                std::vector<char> out(static_cast<char *>(v), static_cast<char *>(v) + n);
                free(v);
                return out;
            }
            if (rc != PC_ENOTFOUND)
                throw StoreError("rendezvous get " + key + ": " + pc_strerror(rc), rc);
            if (std::chrono::steady_clock::now() >= end)
                throw RendezvousTimeout("rendezvous: key " + key + " never came");
            std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
        }
    }

    pw_kv_t kv_;
    std::chrono::milliseconds timeout_;
};

int error_of(const std::exception &e, const char *what) {
    PC_ERROR("collective %s: %s", what, e.what());
    if (dynamic_cast<const RendezvousTimeout *>(&e))
        return PC_ETIMEDOUT;
    if (const auto *s = dynamic_cast<const StoreError *>(&e))
        return s->rc;
    if (dynamic_cast<const gloo::IoException *>(&e)) /* Gloo reports its timeouts as I/O errors */
        return strstr(e.what(), "imed out") ? PC_ETIMEDOUT : PC_EUNAVAIL;
    return PC_EINTERNAL;
}

} // namespace

struct pw_coll {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    int size;
    uint32_t tag;
};

extern "C" int pw_coll_create(const pw_kv_t *kv, const char *prefix, int rank, int size,
                              const char *host, int timeout_ms, pw_coll_t **out) {
    if (!kv || !kv->set || !kv->get || !prefix || !host || size < 1 || rank < 0 || rank >= size ||
        timeout_ms < 1 || !out)
        return PC_EINVAL;
    pw_coll_t *c = new (std::nothrow) pw_coll_t();
    if (!c)
        return PC_ENOMEM;
    try {
        const std::chrono::milliseconds timeout(timeout_ms);
        gloo::transport::tcp::attr attr(host);
        c->dev = gloo::transport::tcp::CreateDevice(attr);
        c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
        c->ctx->setTimeout(timeout); // before connecting: algorithms keep it
        KvStore store(*kv, timeout);
        gloo::rendezvous::PrefixStore ps(prefix, store);
        c->ctx->connectFullMesh(ps, c->dev);
        c->size = size;
        *out = c;
        return 0;
    } catch (const std::exception &e) {
        int rc = error_of(e, "group formation");
        delete c;
        return rc;
    }
}

extern "C" void pw_coll_destroy(pw_coll_t *c) {
    try {
        delete c;
    } catch (const std::exception &e) {
        error_of(e, "teardown");
    }
}

extern "C" int pw_coll_allreduce_sum(pw_coll_t *c, float *buf, size_t n) {
    if (!c || (!buf && n))
        return PC_EINVAL;
    if (n == 0 || c->size == 1)
        return 0;
    try {
        gloo::AllreduceOptions opts(c->ctx);
        opts.setOutput(buf, n);
        opts.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        opts.setTag(c->tag++);
        gloo::allreduce(opts);
        return 0;
    } catch (const std::exception &e) {
        return error_of(e, "allreduce");
    }
}

extern "C" int pw_coll_barrier(pw_coll_t *c, int timeout_ms) {
    if (!c)
        return PC_EINVAL;
    if (c->size == 1)
        return 0;
    try {
        gloo::BarrierOptions opts(c->ctx);
        opts.setTag(c->tag++);
        if (timeout_ms > 0)
            opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        gloo::barrier(opts);
        return 0;
    } catch (const std::exception &e) {
        return error_of(e, "barrier");
    }
}
