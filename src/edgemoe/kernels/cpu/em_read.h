/* Memory read bandwidth probe for `edgemoe bench bw`: the pool reads a buffer once,
 * in 1 MiB tasks, with the widest loads the build allows. Included by expert.c. */
#ifndef EM_READ_H
#define EM_READ_H

#define EM_READ_CHUNK (1L << 20) /* bytes per task: long enough to stream, short enough to share */

typedef struct {
    const uint64_t *buf;
    int64_t words, ntasks;
    atomic_long next, done;
    atomic_ullong sum;
} em_read_call;

static void em_read_task(void *ctx) {
    em_read_call *c = (em_read_call *)ctx;
    for (;; atomic_fetch_add(&c->done, 1)) {
        int64_t task = atomic_fetch_add(&c->next, 1);
        if (task >= c->ntasks) break;
        int64_t lo = task * (EM_READ_CHUNK / 8), hi = lo + EM_READ_CHUNK / 8 < c->words ? lo + EM_READ_CHUNK / 8 : c->words;
        uint64_t acc[8] = {0};
        int64_t k = lo;
        for (; k + 8 <= hi; k += 8)
            for (int j = 0; j < 8; j++) acc[j] ^= c->buf[k + j]; /* vectorised by -O3 */
        for (; k < hi; k++) acc[0] ^= c->buf[k];
        atomic_fetch_xor(&c->sum, acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7]);
    }
    em_wait_count(&c->done, c->ntasks);
}

/* Reads `bytes` once, in chunks shared by the pool; returns a checksum. */
uint64_t em_read(void *pool, const void *buf, int64_t bytes) {
    em_read_call c;
    memset(&c, 0, sizeof(c));
    c.buf = (const uint64_t *)buf;
    c.words = bytes / 8;
    c.ntasks = (c.words + EM_READ_CHUNK / 8 - 1) / (EM_READ_CHUNK / 8);
    em_pool *p = (em_pool *)pool;
    pthread_mutex_lock(&p->call_lock);
    em_pool_run(p, em_pool_slot(p), em_read_task, &c, 0);
    pthread_mutex_unlock(&p->call_lock);
    return (uint64_t)atomic_load(&c.sum);
}

#endif
