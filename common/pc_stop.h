/* pc_stop.h: a daemon's stop signals (SIGTERM, SIGINT) caught into one flag.
 *
 * A plain handler notes the signal and nothing else; the main thread reads it between its steps
 * and stops as asked. Whichever thread takes the signal, the flag is the same: threads started
 * before main (OpenBLAS's pool, made when the library loads) do not have it blocked, and one of
 * them took it with its default action (killed, nothing drained or saved). SA_RESTART: blocking
 * calls go on. ps-server catches them this way while it starts (libuv's handlers take over when
 * its loop runs), ps-serve for its whole run. Process-wide; thread-safe.
 */
#ifndef PC_STOP_H
#define PC_STOP_H

/* Install the handler of SIGTERM and SIGINT. */
void pc_stop_catch(void);

/* The number of the stop signal that came, 0 while none did. */
int pc_stop_signal(void);

#endif
