/* Thread pool for the CPU expert kernels.
 *
 * Persistent workers spin briefly after a call (the next layer's call comes soon),
 * then sleep on a condition variable, so an idle pool costs no CPU and does not
 * compete with torch's OpenMP threads. One call runs at a time (call_lock); the
 * calling thread always works on it too.
 *
 * No barriers: a call's work is a list of tasks claimed from atomic counters, and a
 * phase ends when its tasks are *done*, not when every thread arrives. A worker that
 * wakes late, or is descheduled (more runnable threads than cores: the GPU-driving
 * thread, other processes), joins late or not at all and holds nobody up except
 * through a task it has claimed.
 */
#ifndef EM_POOL_H
#define EM_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* The calling thread's name as top, /proc/<pid>/task/<tid>/comm and the benchmarks'
 * busy-thread lists show it (Linux; at most 15 characters). */
static inline void em_name_thread(const char *name) {
#ifdef __linux__
    prctl(PR_SET_NAME, name, 0, 0, 0);
#else
    (void)name;
#endif
}

#define EM_SPIN_WAIT 4000 /* spins before yielding while a phase finishes */

typedef void (*em_task_fn)(void *ctx);

typedef struct em_pool em_pool;

struct em_pool {
    int nthreads; /* including the caller */
    long spin_ns; /* idle workers spin this long for the next call, then sleep */
    pthread_t *threads;
    pthread_mutex_t call_lock; /* NOTE: one call at a time; ctypes drops the GIL */
    pthread_mutex_t wake_lock;
    pthread_cond_t wake_cv;
    atomic_int generation; /* bumped once per call */
    int sleepers;          /* guarded by wake_lock */
    int stop;
    /* The open call: workers enter (active++) and run fn only while `open`; the
     * caller closes it and waits for active == 0 before its ctx goes away. */
    em_task_fn fn;
    void *ctx;
    atomic_int open;
    atomic_int active;
    void *ws; /* workspace, grown on demand, kept between calls */
    size_t ws_size;
};

static inline void em_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin, then yield, until *counter reaches target. */
static void em_wait_count(atomic_long *counter, long target) {
    for (long spins = 0; atomic_load(counter) < target; spins++) {
        if (spins < EM_SPIN_WAIT)
            em_relax();
        else
            sched_yield();
    }
}

static inline long em_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static int em_wait_call(em_pool *p, int seen) {
    long start = em_now_ns();
    for (int i = 0;; i++) {
        int g = atomic_load(&p->generation);
        if (g != seen) return g;
        em_relax();
        if ((i & 255) == 255 && em_now_ns() - start > p->spin_ns) break;
    }
    pthread_mutex_lock(&p->wake_lock);
    p->sleepers++;
    int g;
    while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->wake_cv, &p->wake_lock);
    p->sleepers--;
    pthread_mutex_unlock(&p->wake_lock);
    return g;
}

static void *em_worker(void *arg) {
    em_pool *p = (em_pool *)arg;
    int seen = 0;
    em_name_thread("em-pool");
    for (;;) {
        int g = em_wait_call(p, seen);
        if (p->stop) return NULL;
        atomic_fetch_add(&p->active, 1);
        /* NOTE: seq_cst pairs with the caller's store open=0 then load active: either
         * this sees the call closed, or the caller sees this worker active. */
        if (atomic_load(&p->open)) p->fn(p->ctx);
        atomic_fetch_sub(&p->active, 1);
        seen = g;
    }
}

/* Runs fn(ctx) on the caller and on every worker that wakes in time; fn must return
 * only when the call's work is complete. Caller holds call_lock. */
static void em_pool_run(em_pool *p, em_task_fn fn, void *ctx) {
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->open, 1);
    pthread_mutex_lock(&p->wake_lock);
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers) pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_lock);
    fn(ctx);
    atomic_store(&p->open, 0);
    while (atomic_load(&p->active)) em_relax();
}

static void em_pool_free(em_pool *p) {
    free(p->threads);
    free(p->ws);
    free(p);
}

static em_pool *em_pool_new(int nthreads, int spin_us) {
    em_pool *p = (em_pool *)calloc(1, sizeof(em_pool));
    if (!p) return NULL;
    p->nthreads = nthreads < 1 ? 1 : nthreads;
    p->spin_ns = spin_us > 0 ? spin_us * 1000L : 0;
    p->threads = (pthread_t *)calloc((size_t)p->nthreads, sizeof(pthread_t));
    if (!p->threads) {
        em_pool_free(p);
        return NULL;
    }
    pthread_mutex_init(&p->call_lock, NULL);
    pthread_mutex_init(&p->wake_lock, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    for (int t = 1; t < p->nthreads; t++) {
        if (pthread_create(&p->threads[t], NULL, em_worker, p) != 0) {
            p->nthreads = t; /* run with the threads we got */
            break;
        }
    }
    return p;
}

static void em_pool_destroy(em_pool *p) {
    pthread_mutex_lock(&p->call_lock);
    pthread_mutex_lock(&p->wake_lock);
    p->stop = 1;
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_lock);
    for (int t = 1; t < p->nthreads; t++) pthread_join(p->threads[t], NULL);
    pthread_mutex_unlock(&p->call_lock);
    em_pool_free(p);
}

/* Workspace of at least `size` bytes, 64-byte aligned; NULL if out of memory. */
static void *em_pool_workspace(em_pool *p, size_t size) {
    if (size <= p->ws_size) return p->ws;
    free(p->ws);
    size = (size + 63) & ~(size_t)63;
    p->ws = aligned_alloc(64, size);
    p->ws_size = p->ws ? size : 0;
    return p->ws;
}

#endif
