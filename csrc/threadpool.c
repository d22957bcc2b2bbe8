/* threadpool.c: persistent workers and a spinning barrier.
 *
 * A forward step runs hundreds of ops, each followed by a barrier, so both
 * the wake-up and the barrier must cost well under a microsecond: workers
 * spin on an atomic generation counter. Between steps (the user typing, the
 * sampler running) they spin a little longer, then sleep on a condition
 * variable so an idle pyllm uses no CPU.
 */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ __volatile__("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

#define SPIN_BEFORE_YIELD 256       /* barrier: spins (~10 us) before giving the core away */
#define SPIN_BEFORE_SLEEP (1 << 18) /* idle worker: spins (~ms) before sleeping */

struct threadpool {
    int n;
    pthread_t *threads;

    /* the current job */
    job_fn fn;
    void *arg;
    atomic_int job_gen;     /* bumped for every job */
    atomic_int n_done;      /* workers finished with the current job */
    atomic_int stop;

    /* sleeping between jobs */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int n_sleeping;

    /* barrier */
    atomic_int bar_count;
    atomic_int bar_gen;
};

typedef struct { threadpool *tp; int ith; } worker_arg;

static void wait_for_job(threadpool *tp, int seen_gen) {
    for (int i = 0; i < SPIN_BEFORE_SLEEP; i++) {
        if (atomic_load_explicit(&tp->job_gen, memory_order_acquire) != seen_gen) return;
        cpu_relax();
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->n_sleeping, 1);
    while (atomic_load(&tp->job_gen) == seen_gen)
        pthread_cond_wait(&tp->cv, &tp->mu);
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mu);
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    threadpool *tp = wa->tp;
    int ith = wa->ith;
    free(wa);
    int seen = 0; /* job_gen at creation: a job posted before we got here is not missed */
    for (;;) {
        wait_for_job(tp, seen);
        seen = atomic_load_explicit(&tp->job_gen, memory_order_acquire);
        if (atomic_load(&tp->stop)) break;
        tp->fn(tp->arg, ith, tp->n);
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
    return NULL;
}

threadpool *threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) { free(tp); return NULL; }
    /* the workers never take the process's signals: Ctrl-C must reach the thread that waits on
     * input (Python's main thread); delivered to a worker, it would wait for the next key */
    sigset_t quiet, old;
    sigemptyset(&quiet);
    sigaddset(&quiet, SIGINT);
    sigaddset(&quiet, SIGTERM);
    sigaddset(&quiet, SIGHUP);
    sigaddset(&quiet, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &quiet, &old);   /* the workers inherit it */
    int started = 1;
    for (; started < n_threads; started++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) break;
        wa->tp = tp;
        wa->ith = started;
        if (pthread_create(&tp->threads[started], NULL, worker_main, wa) != 0) {
            free(wa);
            break;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < n_threads) {
        tp->n = started;
        threadpool_free(tp);
        return NULL;
    }
    return tp;
}

static void wake_workers(threadpool *tp) {
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
}

void threadpool_free(threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->job_gen, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

int threadpool_size(const threadpool *tp) { return tp->n; }

void threadpool_run(threadpool *tp, job_fn fn, void *arg) {
    if (tp->n == 1) { fn(arg, 0, 1); return; }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->n_done, 0);
    /* seq_cst bump, then a look for sleepers: a worker either sees the new
     * generation before sleeping or is counted in n_sleeping and woken */
    atomic_fetch_add(&tp->job_gen, 1);
    wake_workers(tp);
    fn(arg, 0, tp->n);
    int spins = 0;
    while (atomic_load_explicit(&tp->n_done, memory_order_acquire) != tp->n - 1) {
        if (++spins > SPIN_BEFORE_YIELD) { sched_yield(); spins = 0; } else cpu_relax();
    }
}

void threadpool_barrier(threadpool *tp) {
    if (tp->n == 1) return;
    int gen = atomic_load_explicit(&tp->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == tp->n - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->bar_gen, 1, memory_order_release);
        return;
    }
    int spins = 0;
    while (atomic_load_explicit(&tp->bar_gen, memory_order_acquire) == gen) {
        if (++spins > SPIN_BEFORE_YIELD) { sched_yield(); spins = 0; } else cpu_relax();
    }
}
