/* The copier: a host thread that moves a decode prefetch's misses with the GPU's copy
 * engine while a captured CUDA graph runs (kernels/copy_bell.py drives it). A graph's
 * copy nodes have their addresses fixed at capture, but a prefetch's miss list is known
 * only on the device, mid-step; the device gather reads the list in a kernel instead and
 * takes SMs from the compute beside it. Here the device publishes the list, and this
 * thread issues the copies on a stream of its own:
 *
 *   device (a kernel of the graph)          this thread
 *   done[r] = 0; row r = (layer, misses)
 *   flags[r] = 1 (release, system scope) -> sees flags[r], clears it, reads row r,
 *                                           issues one cuMemcpyHtoDAsync per miss and part,
 *                                           then cuStreamWriteValue32(done[r], 1) behind them
 *   ... later: the stream waits until done[r] == 1 (cuStreamWaitValue32, a graph node)
 *
 * Rows are reused round-robin (a prefetch's buffer); a row is rung again only after its
 * wait, so a row holds one request at a time and the clear of done[r] precedes its answer.
 * One row may be `urgent` (a decode layer's own misses, which the layer waits for at once):
 * looked at before the others, so its copies queue ahead of prefetches rung beside it.
 * The driver's functions come as pointers from the caller (no CUDA headers or link here);
 * a host build for the tests passes em_copier_test_copy / em_copier_test_write, which do
 * the same with memcpy and a plain store.
 *
 * By default the thread does not spin: a decode step rings a row every MoE layer (~100 µs
 * apart), and the CPU share's pool owns the cores. It polls every EM_COPIER_POLL_NS while
 * rings come (timer slack 1 µs), and every 500 µs after a second without one; `spin_ns`
 * (the caller's) spins that long after each ring first.
 */
#ifndef EM_COPIER_H
#define EM_COPIER_H

#include <stdint.h>
#include <string.h>

typedef int (*em_cu_copy_fn)(uint64_t dst, const void *src, size_t bytes, void *stream);
typedef int (*em_cu_write_fn)(void *stream, uint64_t addr, uint32_t value, unsigned int flags);
typedef int (*em_cu_ctx_fn)(void *ctx);

#ifndef EM_COPIER_POLL_NS
#define EM_COPIER_POLL_NS 5000L
#endif

typedef struct {
    em_cu_copy_fn copy;
    em_cu_write_fn write;
    void *stream;
    volatile int32_t *flags; /* [nrows]: rung rows (page-locked, written by the device) */
    const int32_t *rows;     /* [nrows][2 + 2 * width]: table layer, 0, ids[width], slots[width] */
    int64_t nrows, width;
    int64_t urgent; /* a row looked at first (a decode layer's own misses), or -1 */
    long spin_ns;   /* spin this long after a ring before polling (0: poll only) */
    const int64_t *src; /* [nlayers][nparts][2]: a layer's host bank base, bytes per expert */
    const int64_t *dst; /* [nparts][3]: the slot bank's device base, bytes per slot, bytes a copy */
    const int64_t *done; /* [nrows]: device addresses of the done words */
    int64_t nlayers, nparts, num_experts, num_slots;
    em_cu_ctx_fn set_ctx;
    void *ctx;
    atomic_int stop, ready; /* ready: 0 starting, 1 running, -1 its context refused */
    atomic_int inside;      /* 1 from a flag seen until its row's copies and answer are issued */
    atomic_long rings, copies, bytes, busy_ns, errors, last_error;
    pthread_t thread;
} em_copier;

/* Row r's copies, then its answer. Always answers: a device waiting on done[r] would wait
 * forever; a failure is counted (errors, last_error) for the host to raise. */
static void em_copier_ring(em_copier *c, int64_t r) {
    const int32_t *row = c->rows + r * (2 + 2 * c->width);
    const int32_t *ids = row + 2, *slots = ids + c->width;
    int64_t layer = row[0];
    long rc = layer < 0 || layer >= c->nlayers ? -1 : 0;
    for (int64_t i = 0; i < c->width && rc == 0; i++) {
        int64_t e = ids[i], s = slots[i];
        if (e < 0) continue;
        if (e >= c->num_experts || s < 0 || s >= c->num_slots) {
            rc = -1; /* NOTE: never copy to or from an address a bad entry would make */
            break;
        }
        for (int64_t p = 0; p < c->nparts && rc == 0; p++) {
            const int64_t *from = c->src + (layer * c->nparts + p) * 2, *to = c->dst + p * 3;
            rc = c->copy((uint64_t)(to[0] + s * to[1]), (const void *)(intptr_t)(from[0] + e * from[1]),
                         (size_t)to[2], c->stream);
            if (rc == 0) {
                atomic_fetch_add(&c->copies, 1);
                atomic_fetch_add(&c->bytes, to[2]);
            }
        }
    }
    long wrc = c->write(c->stream, (uint64_t)c->done[r], 1u, 0u);
    if (rc != 0 || wrc != 0) {
        atomic_fetch_add(&c->errors, 1);
        atomic_store(&c->last_error, rc != 0 ? rc : wrc);
    }
}

static void *em_copier_main(void *arg) {
    em_copier *c = (em_copier *)arg;
    em_name_thread("em-copier");
    /* NOTE: the driver's current context is per thread: this one sets its own first. */
    if (c->set_ctx && c->set_ctx(c->ctx) != 0) {
        atomic_store(&c->ready, -1);
        return NULL;
    }
    atomic_store(&c->ready, 1);
#ifdef __linux__
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* short polls sleep about as asked */
#endif
    long idle_since = em_now_ns();
    int64_t next = 0;
    for (;;) {
        int64_t found = c->urgent >= 0 && __atomic_load_n(&c->flags[c->urgent], __ATOMIC_ACQUIRE) ? c->urgent : -1;
        for (int64_t k = 0; k < c->nrows && found < 0; k++) {
            int64_t r = (next + k) % c->nrows; /* rows ring in order: start where the last one was */
            if (__atomic_load_n(&c->flags[r], __ATOMIC_ACQUIRE)) found = r;
        }
        if (found < 0) {
            if (atomic_load(&c->stop)) break;
            long idle = em_now_ns() - idle_since;
            if (idle < c->spin_ns) {
                em_relax();
                continue;
            }
            struct timespec ts = {0, idle >= 1000000000L ? 500000L : EM_COPIER_POLL_NS};
            nanosleep(&ts, NULL);
            continue;
        }
        atomic_store(&c->inside, 1); /* before the flag clears: em_copier_busy never sees neither */
        __atomic_store_n(&c->flags[found], 0, __ATOMIC_SEQ_CST);
        long start = em_now_ns();
        em_copier_ring(c, found);
        idle_since = em_now_ns();
        atomic_fetch_add(&c->busy_ns, idle_since - start);
        atomic_fetch_add(&c->rings, 1);
        atomic_store(&c->inside, 0);
        if (found != c->urgent) next = (found + 1) % c->nrows;
    }
    return NULL;
}

/* Starts the thread (NULL: failed, its context refused included). `set_ctx(ctx)` runs
 * first on it, when given (the driver's context the stream belongs to). The tables stay
 * the caller's, and alive, until em_copier_stop. */
void *em_copier_start(void *copy, void *write, void *set_ctx, void *ctx, void *stream, int64_t flags, int64_t rows,
                      int64_t nrows, int64_t width, int64_t src, int64_t nlayers, int64_t nparts, int64_t dst,
                      int64_t done, int64_t num_experts, int64_t num_slots, int64_t urgent,
                      int64_t spin_ns) {
    em_copier *c = (em_copier *)calloc(1, sizeof(em_copier));
    if (!c) return NULL;
    c->copy = (em_cu_copy_fn)copy;
    c->write = (em_cu_write_fn)write;
    c->set_ctx = (em_cu_ctx_fn)set_ctx;
    c->ctx = ctx;
    c->stream = stream;
    c->flags = EM_PTR(volatile int32_t *, flags);
    c->rows = EM_PTR(const int32_t *, rows);
    c->nrows = nrows;
    c->width = width;
    c->spin_ns = (long)spin_ns;
    c->urgent = urgent >= 0 && urgent < nrows ? urgent : -1;
    c->src = EM_PTR(const int64_t *, src);
    c->dst = EM_PTR(const int64_t *, dst);
    c->done = EM_PTR(const int64_t *, done);
    c->nlayers = nlayers;
    c->nparts = nparts;
    c->num_experts = num_experts;
    c->num_slots = num_slots;
    if (pthread_create(&c->thread, NULL, em_copier_main, c) != 0) {
        free(c);
        return NULL;
    }
    while (atomic_load(&c->ready) == 0) sched_yield();
    if (atomic_load(&c->ready) < 0) {
        pthread_join(c->thread, NULL);
        free(c);
        return NULL;
    }
    return c;
}

/* [rings, copies, bytes, busy_ns, errors, last_error] since the start. */
void em_copier_stats(void *copier, int64_t *out) {
    em_copier *c = (em_copier *)copier;
    out[0] = atomic_load(&c->rings);
    out[1] = atomic_load(&c->copies);
    out[2] = atomic_load(&c->bytes);
    out[3] = atomic_load(&c->busy_ns);
    out[4] = atomic_load(&c->errors);
    out[5] = atomic_load(&c->last_error);
}

/* 1 while the thread is between seeing a flag and having issued its row's answer: read
 * after the flags, a flag that is clear and this 0 mean every row seen has been issued. */
int em_copier_busy(void *copier) { return atomic_load(&((em_copier *)copier)->inside); }

void em_copier_stop(void *copier) {
    em_copier *c = (em_copier *)copier;
    if (!c) return;
    atomic_store(&c->stop, 1);
    pthread_join(c->thread, NULL);
    free(c);
}

/* The host build's stand-ins for the driver (the tests, no GPU): a copy and a store. */
int em_copier_test_copy(uint64_t dst, const void *src, size_t bytes, void *stream) {
    (void)stream;
    memcpy((void *)(intptr_t)dst, src, bytes);
    return 0;
}

int em_copier_test_write(void *stream, uint64_t addr, uint32_t value, unsigned int flags) {
    (void)stream;
    (void)flags;
    __atomic_store_n((int32_t *)(intptr_t)addr, (int32_t)value, __ATOMIC_RELEASE);
    return 0;
}

#endif
