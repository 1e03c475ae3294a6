/* pc_stop.c: the stop signals caught into one flag (see pc_stop.h).
 *
 * DESIGN: the flag is a lock-free atomic_int, so the handler may set it on any thread and the
 * main thread read it without a race; nothing else happens in the handler. */
#include "pc_stop.h"

#include <signal.h>
#include <stdatomic.h>

static atomic_int g_sig;

static void on_stop(int sig) {
    atomic_store(&g_sig, sig);
}

void pc_stop_catch(void) {
    struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int pc_stop_signal(void) {
    return atomic_load(&g_sig);
}
