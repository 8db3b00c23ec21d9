/* Thread pool for the CPU expert kernels.
 *
 * Persistent workers that spin briefly after a call ends (the next layer's call comes
 * soon), then sleep on a condition variable, so an idle pool costs no CPU and does not
 * compete with torch's OpenMP threads. One call runs at a time (call_lock); the calling
 * thread is worker 0. Phases inside a call are separated by a spinning barrier that
 * yields after a while (an oversubscribed host must not livelock).
 */
#ifndef EM_POOL_H
#define EM_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define EM_SPIN_BARRIER 4000    /* barrier spins before yielding */

typedef void (*em_task_fn)(void *ctx, int tid);

typedef struct em_pool em_pool;

typedef struct {
    em_pool *pool;
    int tid;
} em_worker_arg;

struct em_pool {
    int nthreads;
    long spin_ns; /* idle workers spin this long for the next call, then sleep */
    pthread_t *threads;
    em_worker_arg *args;
    pthread_mutex_t call_lock; /* NOTE: one call at a time; ctypes drops the GIL */
    pthread_mutex_t wake_lock;
    pthread_cond_t wake_cv;
    atomic_int generation; /* bumped once per call */
    int sleepers;          /* guarded by wake_lock */
    int stop;
    em_task_fn fn;
    void *ctx;
    atomic_int bar_count;
    atomic_int bar_sense;
    int *local_sense; /* per tid; tid 0 is whichever thread calls */
    void *ws;         /* workspace, grown on demand, kept between calls */
    size_t ws_size;
};

static inline void em_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline long em_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* All nthreads threads meet here (sense-reversing barrier). */
static void em_barrier(em_pool *p, int tid) {
    int sense = !p->local_sense[tid];
    p->local_sense[tid] = sense;
    if (atomic_fetch_add(&p->bar_count, 1) == p->nthreads - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_store(&p->bar_sense, sense);
        return;
    }
    for (long spins = 0; atomic_load(&p->bar_sense) != sense; spins++) {
        if (spins < EM_SPIN_BARRIER)
            em_relax();
        else
            sched_yield();
    }
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
    em_worker_arg *a = (em_worker_arg *)arg;
    em_pool *p = a->pool;
    int seen = 0;
    for (;;) {
        seen = em_wait_call(p, seen);
        if (p->stop) return NULL;
        p->fn(p->ctx, a->tid);
    }
}

/* Runs fn(ctx, tid) on every thread; fn must end with em_barrier so that no worker
 * still reads ctx when this returns. Caller holds call_lock. */
static void em_pool_run(em_pool *p, em_task_fn fn, void *ctx) {
    p->fn = fn;
    p->ctx = ctx;
    pthread_mutex_lock(&p->wake_lock);
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers) pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_lock);
    fn(ctx, 0);
}

static void em_pool_free(em_pool *p) {
    free(p->threads);
    free(p->args);
    free(p->local_sense);
    free(p->ws);
    free(p);
}

static em_pool *em_pool_new(int nthreads, int spin_us) {
    em_pool *p = (em_pool *)calloc(1, sizeof(em_pool));
    if (!p) return NULL;
    if (nthreads < 1) nthreads = 1;
    p->nthreads = nthreads;
    p->spin_ns = spin_us > 0 ? spin_us * 1000L : 0;
    p->threads = (pthread_t *)calloc((size_t)nthreads, sizeof(pthread_t));
    p->args = (em_worker_arg *)calloc((size_t)nthreads, sizeof(em_worker_arg));
    p->local_sense = (int *)calloc((size_t)nthreads, sizeof(int));
    if (!p->threads || !p->args || !p->local_sense) {
        em_pool_free(p);
        return NULL;
    }
    pthread_mutex_init(&p->call_lock, NULL);
    pthread_mutex_init(&p->wake_lock, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    for (int t = 1; t < nthreads; t++) {
        p->args[t].pool = p;
        p->args[t].tid = t;
        if (pthread_create(&p->threads[t], NULL, em_worker, &p->args[t]) != 0) {
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
