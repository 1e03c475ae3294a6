/* psctl_plot.h: `psctl plot METRICS_LOG OUT.svg|OUT.png`: a worker's training curves.
 *
 * Reads the JSON lines ps-worker writes with --metrics-log (worker/train/pw_telemetry.h) and
 * draws them with PLplot: the loss (the moving average, and each row's batch loss) against the
 * samples trained on, and below it the AUC of every evaluation row, on the same samples axis;
 * titled, axes labelled, a legend per panel. The output's type comes from its name: .svg (PLplot's
 * svg driver: text stays text) or .png (pngcairo), PSCTL_PLOT_WIDTH x PSCTL_PLOT_HEIGHT pixels.
 *
 * DESIGN: psctl rather than ps-worker draws, so a curve can be made after the fact (or while the
 * run goes on, from the lines written so far), on any machine the log is copied to, and the
 * worker (which runs in containers) does not depend on PLplot and cairo. A line that does not
 * parse is an error naming it, except an unterminated last line (a run still writing it).
 * PLplot keeps global state: one plot per process, which psctl is.
 */
#ifndef PSCTL_PLOT_H
#define PSCTL_PLOT_H

#define PSCTL_PLOT_WIDTH  1000
#define PSCTL_PLOT_HEIGHT 700

/* Draw the log at `log` into `out`. Returns an exit status: 0 done, 1 the log could not be read
 * or has no rows, or the picture could not be written (said on stderr), 2 bad usage. */
int psctl_plot(const char *log, const char *out);

#endif
