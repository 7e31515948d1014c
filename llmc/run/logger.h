/*
 * logger.h: the machine-readable log, one JSON object per line (--log FILE).
 *   first, the run's configuration (and again after each resume, with "resumed_from"):
 *                   {"config": {"argv": [...], "target": "CPU", "precision": "FP32", "device": "...",
 *                    "world": 2, "dp": 2, "tp": 1, "pp": 1, "zero": 1, "model": {...}, "batch": {...}, ...}}
 *   per step:       {"step": 12, "loss": 5.12, "lr": 0.0006, "grad_norm": 1.3, "tokens_per_s": 41234, "ms": 12.4}
 *   per evaluation: {"step": 12, "val_loss": 5.31}
 *   per multiple-choice evaluation (--eval-data): {"step": 12, "eval_accuracy": 0.41}
 *   per skipped step (loss scaling, gradients overflowed): {"step": 12, "skipped": true, "loss_scale": 32768}
 * Every line is flushed as it is written, so a crash loses nothing already logged. A write that fails (a
 * full disk) ends the run with an error, like any other lost output.
 *
 * On resume from the checkpoint of step S the log continues where that checkpoint left off: the lines
 * of steps after S (written before a crash, and about to be trained again) and a torn last line are
 * dropped (the file is rewritten atomically), then new lines are appended. So after any number of
 * crashes and resumes every step appears once, as in an uninterrupted run. (The evaluation at step S
 * itself was logged before the checkpoint was saved, and a resumed run does not repeat it.)
 */
#pragma once

#include "../common.h"  // fatal, checked file calls

typedef struct {
    FILE* f;  // NULL: logging off
    const char* path;
} Logger;

static void logger_open(Logger* lg, const char* path, int append) {
    lg->f = path != NULL && path[0] != '\0' ? fopen_check(path, append ? "a" : "w") : NULL;
    lg->path = path;
}

// Resume from step `step`: keep only the complete lines of steps <= step, then append (see above). A
// log that is not a regular file (a pipe, a terminal) is appended to as it is.
static void logger_open_resumed(Logger* lg, const char* path, long long step) {
    struct stat st;
    if (path != NULL && path[0] != '\0' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        char tmp[4200];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE* in = fopen_check(path, "r");
        FILE* out = fopen_check(tmp, "w");
        // getline, not a fixed buffer: a configuration line holds the whole command line and has no
        // length limit, and a line cut in pieces would be dropped as torn
        char* line = NULL;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, in)) > 0) {
            long long s;
            if (line[len - 1] != '\n') continue;  // torn
            int is_config = strncmp(line, "{\"config\": ", 11) == 0;  // the configuration of the run and of each resume
            if (!is_config && (sscanf(line, "{\"step\": %lld", &s) != 1 || s > step)) continue;
            if (fwrite(line, 1, (size_t)len, out) != (size_t)len) fatal("cannot write '%s': %s", tmp, strerror(errno));
        }
        free(line);
        // (getline also stops before the end when it cannot grow its buffer: never a silently shorter log)
        if (ferror(in) || !feof(in)) fatal("read error in '%s': %s", path, strerror(errno));
        fclose(in);
        if (fflush(out) != 0 || fsync(fileno(out)) != 0 || fclose(out) != 0)
            fatal("cannot write '%s': %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    }
    logger_open(lg, path, 1);
}

// Ends a line: flushed now, and any error of the writes since the last line reported
static void logger_end_line(Logger* lg) {
    if (fprintf(lg->f, "}\n") < 0 || fflush(lg->f) != 0 || ferror(lg->f))
        fatal("cannot write the log '%s': %s", lg->path, strerror(errno));
}

// JSON has no NaN or infinity: such a value is written as null
static void json_number(FILE* f, const char* key, double v, const char* fmt) {
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fprintf(f, "null");
}

// a JSON string: quotes, backslashes and control characters escaped (other bytes as they are: UTF-8)
static void json_string(FILE* f, const char* s) {
    fputc('"', f);
    for (const unsigned char* p = (const unsigned char*)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

// Opens the configuration line: the caller writes its fields (', "key": value' each, after the first
// written here) and closes it with logger_config_end.
static int logger_config_begin(Logger* lg, int argc, char** argv) {
    if (!lg->f) return 0;
    fprintf(lg->f, "{\"config\": {\"argv\": [");
    for (int i = 0; i < argc; i++) {
        if (i > 0) fprintf(lg->f, ", ");
        json_string(lg->f, argv[i]);
    }
    fprintf(lg->f, "]");
    return 1;
}

static void logger_config_end(Logger* lg) {
    fprintf(lg->f, "}");
    logger_end_line(lg);
}

static void logger_step(Logger* lg, long long step, float loss, float lr, float grad_norm, double tokens_per_s,
                        double ms) {
    if (!lg->f) return;
    fprintf(lg->f, "{\"step\": %lld", step);
    json_number(lg->f, "loss", loss, "%.9g");
    json_number(lg->f, "lr", lr, "%.6e");
    json_number(lg->f, "grad_norm", grad_norm, "%.9g");
    json_number(lg->f, "tokens_per_s", tokens_per_s, "%.1f");
    json_number(lg->f, "ms", ms, "%.3f");
    logger_end_line(lg);
}

static void logger_eval(Logger* lg, long long step, float val_loss) {
    if (!lg->f) return;
    fprintf(lg->f, "{\"step\": %lld", step);
    json_number(lg->f, "val_loss", val_loss, "%.9g");
    logger_end_line(lg);
}

static void logger_eval_accuracy(Logger* lg, long long step, float accuracy) {
    if (!lg->f) return;
    fprintf(lg->f, "{\"step\": %lld", step);
    json_number(lg->f, "eval_accuracy", accuracy, "%.6f");
    logger_end_line(lg);
}

// a step skipped because gradients overflowed, and the loss scale after it
static void logger_skip(Logger* lg, long long step, float loss_scale) {
    if (!lg->f) return;
    fprintf(lg->f, "{\"step\": %lld, \"skipped\": true", step);
    json_number(lg->f, "loss_scale", loss_scale, "%g");
    logger_end_line(lg);
}

static void logger_close(Logger* lg) {
    if (lg->f && fclose(lg->f) != 0) fatal("cannot write the log '%s': %s", lg->path, strerror(errno));
    lg->f = NULL;
}
