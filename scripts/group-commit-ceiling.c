/*
 * The ceiling of `dlab bench group-commit` on this machine: the same
 * measurement with the store's event loop modelled in C, so no Python cost
 * but the one you pass in.
 *
 * One thread plays the event loop. 64 producers each put one record at a
 * time; a put costs 5, 4, 3.5 or 3 us of CPU on the loop (the work a put
 * costs the real store: task wake-up, future, message, encode) plus a
 * pwrite of one 1,100-byte record, and is acknowledged when an fdatasync
 * started after its pwrite returns. Three flush schedules:
 *   serial     the loop runs every ready producer, then fdatasyncs inline
 *              (what the store does when its loop is idle);
 *   pipelined  a second thread fdatasyncs while the loop keeps running
 *              producers; a flush starts as soon as none is in flight and
 *              covers everything appended so far (RocketMQ's
 *              GroupCommitService); completions come back through an
 *              eventfd, with no lock the loop waits on;
 *   halves     as pipelined, but a flush waits until half the producers'
 *              puts are appended (or nothing else is ready), so two
 *              cohorts alternate: one in its fsync, the other on the loop.
 * The baseline is the bench's own: write one record + fdatasync, per put,
 * into a new file. Each line prints puts/s and the ratio to it.
 *
 * What it showed (2-core VM; one record + fdatasync ran at 6,400-7,900 a
 * second): at 5 us a put, the store's own cost (measured with its fsync
 * made a no-op), the serial schedule gives 110,000-118,000 puts/s, ratio
 * 14.5-17.6, where the store itself measured 112,000-144,000 (ratio
 * 14.9-20.7). A ratio of 20 needs 3-4 us a put, depending on that run's
 * fsync rate; bare asyncio (64 tasks awaiting futures resolved in groups,
 * each producer building its message) costs 2.0 us (1.4 without the
 * message), so the store's own work would have to fit in 1-2 us a put
 * against about 3 today. Flushing as soon as possible (pipelined) gained
 * up to 12% in some runs and lost up to 7% in others: its flushes fragment
 * into cohorts of 12-23 puts. Two alternating cohorts (halves) gained
 * 5-24%: 116,000-135,000 puts/s at 5 us, ratio 15.5-18, because an fsync
 * and the hand-offs around it take longer than the other cohort's CPU
 * work. Halves reached 20 at 3.5 us a put in one of two runs, at 3 us in
 * both.
 *
 * Usage: scripts/group-commit-ceiling [DIR] (it compiles this file with cc).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { PRODUCERS = 64, RECORD_BYTES = 1100 };
static const double SECONDS = 3.0;
static const size_t FILE_BYTES = 256u << 20;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void burn_us(double us) {
    double until = now() + us * 1e-6;
    while (now() < until) {
    }
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* ---- the flush thread of the pipelined schedule ---- */
static int log_fd, done_fd;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int requested, quitting;

static void *flusher(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (!requested && !quitting)
            pthread_cond_wait(&cv, &mu);
        if (quitting) {
            pthread_mutex_unlock(&mu);
            return NULL;
        }
        requested = 0;
        pthread_mutex_unlock(&mu);
        if (fdatasync(log_fd) != 0)
            die("fdatasync");
        uint64_t one = 1;
        if (write(done_fd, &one, sizeof one) != sizeof one)
            die("eventfd write");
    }
}

static void request_flush(void) {
    pthread_mutex_lock(&mu);
    requested = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* Zero-filled, synced file, as the store's segment is once its zeros are
 * written ahead (so an fdatasync commits no extent conversion). */
static int open_zeroed(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    char *zeros = calloc(1, 1 << 20);
    for (size_t off = 0; off < FILE_BYTES; off += 1 << 20)
        if (pwrite(fd, zeros, 1 << 20, (off_t)off) != 1 << 20)
            die("pwrite zeros");
    free(zeros);
    if (fdatasync(fd) != 0)
        die("fdatasync");
    return fd;
}

enum schedule { SERIAL, PIPELINED, HALVES };
static const char *const SCHEDULE_NAMES[] = {"serial", "pipelined", "halves"};

static double run(const char *path, enum schedule schedule, double per_put_us,
                  double *puts_per_fsync) {
    int pipelined = schedule != SERIAL;
    char rec[RECORD_BYTES];
    memset(rec, 'r', sizeof rec);
    log_fd = open_zeroed(path);
    done_fd = eventfd(0, EFD_NONBLOCK);
    pthread_t thread;
    requested = quitting = 0;
    if (pipelined && pthread_create(&thread, NULL, flusher, NULL) != 0)
        die("pthread_create");
    off_t off = 0;
    int ready = PRODUCERS, appended = 0, in_flight = 0, busy = 0;
    long acked = 0, fsyncs = 0;
    double t0 = now(), end = t0 + SECONDS;
    while (now() < end && off + RECORD_BYTES < (off_t)FILE_BYTES) {
        if (!pipelined) {
            for (; ready; ready--, appended++) {
                burn_us(per_put_us);
                if (pwrite(log_fd, rec, sizeof rec, off) != sizeof rec)
                    die("pwrite");
                off += sizeof rec;
            }
            if (fdatasync(log_fd) != 0)
                die("fdatasync");
            fsyncs++;
            acked += appended;
            ready = appended;
            appended = 0;
            continue;
        }
        uint64_t n;
        int woken = 0;
        if (busy && read(done_fd, &n, sizeof n) == sizeof n) {
            busy = 0;
            fsyncs++;
            acked += in_flight;
            woken = in_flight;
            in_flight = 0;
        }
        int flush_now = schedule == PIPELINED || !ready || appended >= PRODUCERS / 2;
        if (!busy && appended && flush_now) {
            in_flight = appended;
            appended = 0;
            busy = 1;
            request_flush();
        }
        ready += woken;
        if (ready) {
            burn_us(per_put_us);
            if (pwrite(log_fd, rec, sizeof rec, off) != sizeof rec)
                die("pwrite");
            off += sizeof rec;
            ready--;
            appended++;
        } else {
            struct pollfd p = {done_fd, POLLIN, 0};
            poll(&p, 1, -1);
        }
    }
    double wall = now() - t0;
    if (pipelined) {
        pthread_mutex_lock(&mu);
        quitting = 1;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(thread, NULL);
    }
    close(done_fd);
    close(log_fd);
    unlink(path);
    *puts_per_fsync = fsyncs ? (double)acked / fsyncs : 0;
    return acked / wall;
}

/* The bench's baseline: one record appended and fdatasynced per put. */
static double baseline(const char *path) {
    char rec[RECORD_BYTES];
    memset(rec, 'r', sizeof rec);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    long n = 0;
    double t0 = now(), end = t0 + SECONDS;
    while (now() < end) {
        if (write(fd, rec, sizeof rec) != sizeof rec || fdatasync(fd) != 0)
            die("baseline write");
        n++;
    }
    double wall = now() - t0;
    close(fd);
    unlink(path);
    return n / wall;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/group-commit-ceiling.%d", dir, (int)getpid());
    double base = baseline(path);
    printf("baseline: one record + fdatasync per put: %.0f puts/s\n", base);
    printf("%-10s %9s %10s %14s %6s\n", "schedule", "us/put", "puts/s", "puts/fsync", "ratio");
    const double costs[] = {5.0, 4.0, 3.5, 3.0};
    for (size_t i = 0; i < sizeof costs / sizeof costs[0]; i++) {
        for (int schedule = SERIAL; schedule <= HALVES; schedule++) {
            double per_fsync;
            double rate = run(path, (enum schedule)schedule, costs[i], &per_fsync);
            printf("%-10s %9.1f %10.0f %14.1f %6.2f\n", SCHEDULE_NAMES[schedule], costs[i],
                   rate, per_fsync, rate / base);
        }
    }
    return 0;
}
