/* The worker's telemetry (worker/train/pw_telemetry.h) in process, its /metrics read over HTTP:
 * emberps_worker_samples_total is a counter that never goes down (a job rollback takes back the
 * samples the model holds, not those trained: the counter went down, a reset to Prometheus), and
 * the speed after a rollback is no wrapped-around 1.8e19 samples/s. */
#include "test_util.h"

#include "raw_frame.h"
#include "pw_telemetry.h"

#include <math.h>
#include <unistd.h>

/* The value of `name` in the endpoint's text; NAN when absent. */
static double sample_of(int port, const char *name) {
    static char out[1 << 16];
    assert_int_equal(http_get(port, "/metrics", out, sizeof out), 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(out, key);
    return at ? strtod(at + strlen(key), NULL) : NAN;
}

static void test_samples_never_down(void **state) {
    (void)state;
    const pw_telemetry_opts_t o = {.host = "127.0.0.1", .port = 0, .model = "dlrm"};
    pw_telemetry_t *tm;
    assert_int_equal(pw_telemetry_open(&o, &tm), 0);
    const int port = pw_telemetry_port(tm);
    assert_true(port > 0);
    pw_telemetry_step_t s = {.step = 10, .samples = 1000, .epoch = 1};
    pw_telemetry_publish(tm, &s);
    assert_true(sample_of(port, "emberps_worker_samples_total") == 1000);
    s.step = 5; /* a job rollback: the model holds 500 samples' training */
    s.samples = 500;
    pw_telemetry_publish(tm, &s);
    assert_true(sample_of(port, "emberps_worker_samples_total") == 1000);
    usleep(1100 * 1000); /* a new speed window */
    s.step = 7;
    s.samples = 700;
    pw_telemetry_publish(tm, &s);
    const double total = sample_of(port, "emberps_worker_samples_total");
    const double rate = sample_of(port, "emberps_worker_samples_per_second");
    print_message("samples_total %g after a rollback and 200 more; %g samples/s\n", total, rate);
    assert_true(total == 1200);
    assert_true(rate >= 0 && rate < 1e4);
    pw_telemetry_close(tm);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_samples_never_down)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
