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
 *
 * Calls run in slots (`em_slot`: the call's state and workspace, and how many threads
 * are inside it). A call takes the lowest slot nobody is inside; a *detached* call
 * (em_detach.h) returns once its work is done, without waiting for a descheduled worker
 * to leave it, and the next call takes another slot meanwhile. A worker is inside one
 * slot at a time, so nthreads + 1 slots always leave one free.
 */
#ifndef EM_POOL_H
#define EM_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

static _Thread_local int em_in_worker; /* 1 on the pool's workers, 0 on callers */

typedef struct em_pool em_pool;

/* One call's place: its task function and state, and the threads inside it. */
typedef struct {
    em_task_fn fn;
    void *ctx;
    atomic_int open;   /* workers enter (active++) and run fn only while open */
    atomic_int active; /* threads inside: its state may be read until this is 0 */
    void *call;        /* the call's state (expert.c's em_call), allocated at first use */
    void *ws;          /* workspace, grown on demand, kept between calls */
    size_t ws_size;
    char pad[64 - (sizeof(void *) * 4 + sizeof(atomic_int) * 2 + sizeof(size_t)) % 64];
} em_slot;

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
    int nslots; /* nthreads + 1 */
    em_slot *slots;
    _Atomic(em_slot *) current; /* the open call's slot (the last call's between calls) */
    /* counters (em_pool_stats): tasks run again for a late thread, detached calls that
     * returned with a thread still inside, the most slots in use at once */
    atomic_long rescued, left_behind;
    atomic_int slots_peak;
};

static inline void em_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* One turn of a wait: spin first, yield once it has lasted (EM_SPIN_WAIT turns). */
static inline void em_backoff(long spins) {
    if (spins < EM_SPIN_WAIT)
        em_relax();
    else
        sched_yield();
}

/* Spin, then yield, until *counter reaches target. */
static void em_wait_count(atomic_long *counter, long target) {
    for (long spins = 0; atomic_load(counter) < target; spins++) em_backoff(spins);
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
    em_in_worker = 1;
    em_name_thread("em-pool");
    for (;;) {
        int g = em_wait_call(p, seen);
        if (p->stop) return NULL;
        em_slot *s = atomic_load(&p->current);
        atomic_fetch_add(&s->active, 1);
        /* NOTE: seq_cst pairs with the caller's store open=0 then load active: either
         * this sees the call closed, or the caller sees this worker active. A slot taken
         * for a new call after this thread read `current` is opened only once its state
         * is written: entering it then is joining that call. */
        if (atomic_load(&s->open)) s->fn(s->ctx);
        atomic_fetch_sub(&s->active, 1);
        seen = g;
    }
}

/* The lowest slot nobody is inside (one always frees: a thread is in at most one). */
static em_slot *em_pool_slot(em_pool *p) {
    for (;;) {
        for (int i = 0; i < p->nslots; i++) {
            if (atomic_load(&p->slots[i].active)) continue;
            if (i + 1 > atomic_load_explicit(&p->slots_peak, memory_order_relaxed))
                atomic_store_explicit(&p->slots_peak, i + 1, memory_order_relaxed);
            return &p->slots[i];
        }
        em_relax();
    }
}

/* Runs fn(ctx) in slot s on the caller and on every worker that wakes in time; fn must
 * return only when the call's work is complete. `detached`: return then, even while a
 * worker is still inside s (ctx and s's workspace must hold everything such a worker may
 * still read or write); else wait for every worker to leave. Caller holds call_lock. */
static void em_pool_run(em_pool *p, em_slot *s, em_task_fn fn, void *ctx, int detached) {
    s->fn = fn;
    s->ctx = ctx;
    atomic_store(&s->open, 1);
    atomic_store(&p->current, s);
    pthread_mutex_lock(&p->wake_lock);
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers) pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_lock);
    fn(ctx);
    atomic_store(&s->open, 0);
    if (detached) {
        if (atomic_load(&s->active)) atomic_fetch_add_explicit(&p->left_behind, 1, memory_order_relaxed);
        return;
    }
    while (atomic_load(&s->active)) em_relax();
}

static void em_pool_free(em_pool *p) {
    for (int i = 0; p->slots && i < p->nslots; i++) {
        free(p->slots[i].call);
        free(p->slots[i].ws);
    }
    free(p->slots);
    free(p->threads);
    free(p);
}

static em_pool *em_pool_new(int nthreads, int spin_us) {
    em_pool *p = (em_pool *)calloc(1, sizeof(em_pool));
    if (!p) return NULL;
    p->nthreads = nthreads < 1 ? 1 : nthreads;
    p->spin_ns = spin_us > 0 ? spin_us * 1000L : 0;
    p->threads = (pthread_t *)calloc((size_t)p->nthreads, sizeof(pthread_t));
    p->nslots = p->nthreads + 1;
    p->slots = (em_slot *)aligned_alloc(64, (size_t)p->nslots * sizeof(em_slot));
    if (!p->threads || !p->slots) {
        em_pool_free(p);
        return NULL;
    }
    memset(p->slots, 0, (size_t)p->nslots * sizeof(em_slot));
    atomic_init(&p->current, &p->slots[0]);
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

/* Slot s's workspace of at least `size` bytes, 64-byte aligned; NULL if out of memory. */
static void *em_slot_workspace(em_slot *s, size_t size) {
    if (size <= s->ws_size) return s->ws;
    free(s->ws);
    size = (size + 63) & ~(size_t)63;
    s->ws = aligned_alloc(64, size);
    s->ws_size = s->ws ? size : 0;
    return s->ws;
}

/* Waits until no thread is inside any slot (no call running, no late worker of a detached
 * call still reading its inputs): before the buffers those calls read are freed while the
 * pool lives on. */
static void em_pool_quiesce(em_pool *p) {
    pthread_mutex_lock(&p->call_lock);
    for (int i = 0; i < p->nslots; i++)
        for (long spins = 0; atomic_load(&p->slots[i].active); spins++) em_backoff(spins);
    pthread_mutex_unlock(&p->call_lock);
}

/* [tasks run again for a late thread, detached calls that returned with a thread still
 * inside, the most slots in use at once] since the pool began, and [3] the threads inside
 * a slot now (a racy count: between calls, the late workers still inside). */
static void em_pool_read_stats(em_pool *p, int64_t *out) {
    out[0] = atomic_load(&p->rescued);
    out[1] = atomic_load(&p->left_behind);
    out[2] = atomic_load(&p->slots_peak);
    out[3] = 0;
    for (int i = 0; i < p->nslots; i++) out[3] += atomic_load(&p->slots[i].active);
}

#endif
