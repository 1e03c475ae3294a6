/* psctl_plot.c: a worker's metrics log drawn with PLplot (see psctl_plot.h for the contract).
 *
 * DESIGN: the log is read into series first (samples, loss, moving average; evaluations'
 * samples and AUC), each a growing array of doubles; then one PLplot page with two viewports
 * sharing the samples axis: the loss on top (with the title), the AUC below. Non-finite values
 * (null in the log: a loss that diverged) are left out of a series. Colours are set explicitly
 * (a white page, black axes) because PLplot's default map draws on black.
 */
#include "psctl_plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <plplot.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- series ---- */

typedef struct series {
    double *x, *y;
    size_t n, cap;
} series_t;

static int series_add(series_t *s, double x, double y) {
    if (!isfinite(x) || !isfinite(y))
        return 0;
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

static void series_free(series_t *s) {
    free(s->x);
    free(s->y);
}

/* The range of ys (and of xs) over the series with points, padded by 5% (a flat one by 0.05). */
static void range(const series_t *const *ss, int n, bool use_x, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < ss[k]->n; i++) {
            const double v = use_x ? ss[k]->x[i] : ss[k]->y[i];
            *lo = v < *lo ? v : *lo;
            *hi = v > *hi ? v : *hi;
        }
    if (!(*lo <= *hi)) {
        *lo = 0;
        *hi = 1;
    }
    const double pad = *hi > *lo ? 0.05 * (*hi - *lo) : 0.05;
    *lo -= use_x ? 0 : pad;
    *hi += pad;
}

/* ---- reading the log ---- */

typedef struct curves {
    series_t loss, ewma, auc;
    size_t rows, evals;
} curves_t;

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Read the rows of `path`; 0, or 1 after saying why on stderr. */
static int read_log(const char *path, curves_t *c) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "psctl: plot: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (size_t lineno = 1; !rc && (len = getline(&line, &cap, f)) > 0; lineno++) {
        const bool whole = line[len - 1] == '\n';
        cJSON *o = cJSON_Parse(line);
        if (!o || !cJSON_IsObject(o)) {
            cJSON_Delete(o);
            if (!whole) /* the last line, still being written */
                break;
            if (strspn(line, " \t\r\n") == (size_t)len)
                continue;
            fprintf(stderr, "psctl: plot: %s: line %zu is not a JSON object\n", path, lineno);
            rc = 1;
            break;
        }
        const double samples = num(o, "samples");
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
        const bool eval = cJSON_IsString(kind) && strcmp(kind->valuestring, "eval") == 0;
        if (isnan(samples)) {
            fprintf(stderr, "psctl: plot: %s: line %zu has no \"samples\"\n", path, lineno);
            rc = 1;
        } else if (series_add(&c->loss, samples, num(o, "loss")) ||
                   series_add(&c->ewma, samples, num(o, "loss_ewma")) ||
                   (eval && series_add(&c->auc, samples, num(o, "auc")))) {
            fprintf(stderr, "psctl: plot: out of memory\n");
            rc = 1;
        }
        c->rows++;
        c->evals += eval;
        cJSON_Delete(o);
    }
    free(line);
    if (!rc && ferror(f)) {
        fprintf(stderr, "psctl: plot: cannot read %s: %s\n", path, strerror(errno));
        rc = 1;
    }
    fclose(f);
    if (!rc && !c->loss.n && !c->auc.n) {
        fprintf(stderr,
                "psctl: plot: %s has no rows with a loss or an AUC (is it a ps-worker "
                "--metrics-log?)\n",
                path);
        rc = 1;
    }
    return rc;
}

/* ---- drawing ---- */

enum { COL_BG, COL_FG, COL_EWMA, COL_BATCH, COL_AUC };

static void legend(int n, const char *const *text, const PLINT *colors, const PLINT *opts,
                   PLINT where) {
    PLFLT w, h;
    PLINT styles[2] = {1, 1}, symnum[2] = {1, 1};
    PLFLT widths[2] = {2, 1}, scales[2] = {1, 1};
    const char *symbols[2] = {"#(728)", "#(728)"}; /* a filled circle */
    pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
             PL_POSITION_RIGHT | where | PL_POSITION_INSIDE, 0.02, 0.03, 0.08, COL_BG, COL_FG, 1, 0,
             0, n, opts, 1.0, 0.8, 2.0, 0.0, colors, text, NULL, NULL, NULL, NULL, colors, styles,
             widths, colors, scales, symnum, symbols);
}

/* The panel of `ys` over [xlo, xhi] in viewport (top .. bottom of the page, 0..1). */
static void panel(double top, double bottom, double xlo, double xhi, const series_t *const *ys,
                  int n, const char *ylabel, const char *title) {
    double ylo, yhi;
    range(ys, n, false, &ylo, &yhi);
    plvpor(0.09, 0.93, bottom, top);
    plwind(xlo, xhi, ylo, yhi);
    plcol0(COL_FG);
    plbox("bcnst", 0, 0, "bcnstv", 0, 0);
    pllab("samples", ylabel, title);
}

static int draw(const curves_t *c, const char *out) {
    const size_t len = strlen(out);
    const char *dev = len > 4 && strcmp(out + len - 4, ".svg") == 0   ? "svg"
                      : len > 4 && strcmp(out + len - 4, ".png") == 0 ? "pngcairo"
                                                                      : NULL;
    if (!dev) {
        fprintf(stderr, "psctl: plot: %s: the output must end in .svg or .png\n", out);
        return 2;
    }
    FILE *probe = fopen(out, "w"); /* PLplot exits the process on an unwritable file */
    if (!probe) {
        fprintf(stderr, "psctl: plot: cannot write %s: %s\n", out, strerror(errno));
        return 1;
    }
    fclose(probe);
    plsdev(dev);
    plsfnam(out);
    plspage(0, 0, PSCTL_PLOT_WIDTH, PSCTL_PLOT_HEIGHT, 0, 0);
    plscol0(COL_BG, 255, 255, 255);
    plscol0(COL_FG, 0, 0, 0);
    plscol0(COL_EWMA, 200, 30, 30);
    plscol0(COL_BATCH, 170, 170, 170);
    plscol0(COL_AUC, 30, 80, 200);
    plinit();
    pladv(0);
    plschr(0, 0.9);
    const series_t *all[] = {&c->loss, &c->ewma, &c->auc};
    double xlo, xhi;
    range(all, 3, true, &xlo, &xhi);
    /* the loss */
    const series_t *loss[] = {&c->loss, &c->ewma};
    panel(0.92, 0.60, xlo, xhi, loss, 2, "loss (BCE)", "EmberPS training: loss and test AUC");
    plwidth(1);
    plcol0(COL_BATCH);
    plline((PLINT)c->loss.n, c->loss.x, c->loss.y);
    plwidth(2);
    plcol0(COL_EWMA);
    plline((PLINT)c->ewma.n, c->ewma.x, c->ewma.y);
    plwidth(1);
    const char *ltext[] = {"train loss (moving average)", "batch loss"};
    const PLINT lcol[] = {COL_EWMA, COL_BATCH}, lopt[] = {PL_LEGEND_LINE, PL_LEGEND_LINE};
    legend(2, ltext, lcol, lopt, PL_POSITION_TOP); /* a falling loss leaves it free */
    /* the AUC of each evaluation */
    const series_t *auc[] = {&c->auc};
    panel(0.44, 0.12, xlo, xhi, auc, 1, "test AUC", "");
    if (c->auc.n) {
        plcol0(COL_AUC);
        plwidth(2);
        plline((PLINT)c->auc.n, c->auc.x, c->auc.y);
        plstring((PLINT)c->auc.n, c->auc.x, c->auc.y, "#(728)");
        plwidth(1);
    } else {
        plcol0(COL_FG);
        plptex(0.5 * (xlo + xhi), 0.5, 1, 0, 0.5, "no evaluations in the log (--eval-every)");
    }
    const char *atext[] = {"test AUC (per evaluation)"};
    const PLINT acol[] = {COL_AUC}, aopt[] = {PL_LEGEND_LINE | PL_LEGEND_SYMBOL};
    legend(1, atext, acol, aopt, PL_POSITION_BOTTOM); /* a rising AUC leaves it free */
    plend();
    return 0;
}

/* ---- API ---- */

int psctl_plot(const char *log, const char *out) {
    curves_t c = {0};
    int rc = read_log(log, &c);
    if (!rc && !(rc = draw(&c, out)))
        printf("%s: %zu rows (%zu evaluations) drawn to %s\n", log, c.rows, c.evals, out);
    series_free(&c.loss);
    series_free(&c.ewma);
    series_free(&c.auc);
    return rc;
}
