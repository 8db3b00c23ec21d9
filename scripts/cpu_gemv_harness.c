/* A per-core streaming harness for the CPU expert GEMV's inner loops (not the engine's
 * kernel: kernels/cpu/ is): how many GB/s of weights a one-token GEMV reads with
 *   int8 cvt   int8 -> int32 -> fp32, FMA with fp32 activations (the kernel's int8 path today)
 *   int8 i16   int8 -> int16, vpmaddwd with int16 fixed-point activations, int32 sums
 *   int8 vnni  the same with vpdpwssd (AVX512-VNNI)
 *   read       the same loads, xor-folded (the access pattern's own ceiling)
 *   bf16       vdpbf16ps over bf16 rows (the bf16 path)
 * over a Qwen3-30B-A3B layer's gate_up rows (8 experts x 1536 rows x 2048), rotating through
 * 1 GiB so every layer comes from RAM; threads split each layer's rows, 4 rows a pass.
 * `pages`: a group of 8 int8 rows is read as its even rows (one a 4 KiB page), then its odd
 * ones, so each page is one in-order stream; `pages` 2: rows one after the other (one stream; int8
 * cvt only); `pf`: software prefetch this many rows ahead.
 *
 *   cc -O3 -march=native -o /tmp/harness scripts/cpu_gemv_harness.c -lpthread
 *   /tmp/harness THREADS REPS PF PAGES     (e.g. 16 3 8 1)
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 2048
#define ROWS (1536 * 8)
#define POOL 40 /* layers of int8 rows: 40 x 25 MB = 1 GB */

static int8_t *W;
static uint16_t *WB;
static float X[K];
static int16_t XQ[K];
static uint16_t XB[K];
static int mode, nthreads, pf, pages;
static volatile float sink[256];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define PF4(w, k, stride) \
    for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(w[j] + (k)) + (size_t)pf * (stride), _MM_HINT_T0)

static float rows_cvt(const int8_t *const *w) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int k = 0; k < K; k += 16) {
        if ((k & 63) == 0) PF4(w, k, K);
        __m512 x = _mm512_loadu_ps(X + k);
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w[j] + k)))), x, a[j]);
    }
    return _mm512_reduce_add_ps(a[0]) + _mm512_reduce_add_ps(a[1]) + _mm512_reduce_add_ps(a[2]) + _mm512_reduce_add_ps(a[3]);
}

static float rows_i16(const int8_t *const *w, int vnni) {
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int k = 0; k < K; k += 32) {
        if ((k & 63) == 0) PF4(w, k, K);
        __m512i x = _mm512_loadu_si512(XQ + k);
        for (int j = 0; j < 4; j++) {
            __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w[j] + k)));
            a[j] = vnni ? _mm512_dpwssd_epi32(a[j], v, x) : _mm512_add_epi32(a[j], _mm512_madd_epi16(v, x));
        }
    }
    return (float)(_mm512_reduce_add_epi32(a[0]) + _mm512_reduce_add_epi32(a[1]) + _mm512_reduce_add_epi32(a[2]) +
                   _mm512_reduce_add_epi32(a[3]));
}

static float rows_read(const int8_t *const *w) {
    __m512i a = _mm512_setzero_si512();
    for (int k = 0; k < K; k += 64) {
        PF4(w, k, K);
        for (int j = 0; j < 4; j++) a = _mm512_xor_si512(a, _mm512_loadu_si512(w[j] + k));
    }
    return (float)_mm512_reduce_add_epi32(a);
}

static float rows_bf16(const uint16_t *const *w) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int k = 0; k < K; k += 32) {
        PF4(w, k, 2 * K);
        __m512bh x = (__m512bh)_mm512_loadu_si512(XB + k);
        for (int j = 0; j < 4; j++) a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)_mm512_loadu_si512(w[j] + k), x);
    }
    return _mm512_reduce_add_ps(a[0]) + _mm512_reduce_add_ps(a[1]) + _mm512_reduce_add_ps(a[2]) + _mm512_reduce_add_ps(a[3]);
}

/* One row after the other (a single in-order stream), 4 accumulators over k. */
static float rows_seq(const int8_t *b) {
    float s = 0;
    for (int r = 0; r < 4; r++) {
        const int8_t *w = b + (size_t)r * K;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int k = 0; k < K; k += 64) {
            _mm_prefetch((const char *)(w + k) + (size_t)pf * K, _MM_HINT_T0);
            for (int j = 0; j < 4; j++) {
                __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + k + 16 * j))));
                a[j] = _mm512_fmadd_ps(v, _mm512_loadu_ps(X + k + 16 * j), a[j]);
            }
        }
        s += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
    }
    return s;
}

static float int8_pass(const int8_t *b, int stride) {
    if (pages == 2 && mode == 0) return rows_seq(b);
    const int8_t *w[4] = {b, b + stride * K, b + 2 * stride * K, b + 3 * stride * K};
    switch (mode) {
    case 0: return rows_cvt(w);
    case 1: return rows_i16(w, 0);
    case 2: return rows_i16(w, 1);
    default: return rows_read(w);
    }
}

typedef struct {
    int id, layer;
} arg_t;

static pthread_barrier_t layer_done;
static int layers_now;

/* One layer's share of rows: thread `id` of `nthreads`. */
static float layer_rows(int id, int layer) {
    arg_t one = {id, layer}, *a = &one;
    int per = ROWS / nthreads / 8 * 8;
    float s = 0;
    for (int r = a->id * per; r < (a->id + 1) * per; r += 8) {
        if (mode == 4) {
            const uint16_t *b = WB + ((size_t)a->layer * ROWS + r) * K;
            for (int h = 0; h < 2; h++) {
                const uint16_t *w[4] = {b + 4 * h * K, b + (4 * h + 1) * K, b + (4 * h + 2) * K, b + (4 * h + 3) * K};
                s += rows_bf16(w);
            }
            continue;
        }
        const int8_t *b = W + ((size_t)a->layer * ROWS + r) * K;
        if (pages) { /* even rows (a page each), then the odd ones */
            s += int8_pass(b, 2);
            s += int8_pass(b + K, 2);
        } else { /* 4 adjacent rows, then the next 4 (pages 2: one at a time) */
            s += int8_pass(b, 1);
            s += int8_pass(b + 4 * K, 1);
        }
    }
    return s;
}

/* The threads live through a whole measurement; a barrier after each layer (as the
 * kernel's phases end): no thread creation inside the timing. */
static void *work(void *p) {
    arg_t *a = p;
    float s = 0;
    for (int l = 0; l < layers_now; l++) {
        s += layer_rows(a->id, l);
        pthread_barrier_wait(&layer_done);
    }
    sink[a->id] = s;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s THREADS REPS PF PAGES\n", argv[0]);
        return 2;
    }
    nthreads = atoi(argv[1]);
    int reps = atoi(argv[2]);
    pf = atoi(argv[3]);
    pages = atoi(argv[4]);
    size_t n = (size_t)POOL * ROWS * K;
    W = aligned_alloc(4096, n);
    WB = aligned_alloc(4096, n);
    for (size_t i = 0; i < n; i++) W[i] = (int8_t)((i * 2654435761u) >> 24);
    for (size_t i = 0; i < n / 2; i++) WB[i] = 0x3f80 + (i & 15);
    for (int k = 0; k < K; k++) X[k] = 1.0f / (k + 1), XQ[k] = (int16_t)k, XB[k] = 0x3f80;
    const char *names[] = {"int8 cvt", "int8 i16", "int8 vnni", "read", "bf16"};
    for (int rep = 0; rep < reps; rep++)
        for (mode = 0; mode < 5; mode++) {
            int layers = layers_now = mode == 4 ? POOL / 2 : POOL; /* bf16 rows: 2 bytes a weight */
            pthread_t th[256];
            arg_t ar[256];
            pthread_barrier_init(&layer_done, 0, (unsigned)nthreads);
            double t0 = now();
            for (int i = 0; i < nthreads; i++) ar[i] = (arg_t){i, 0}, pthread_create(&th[i], 0, work, &ar[i]);
            for (int i = 0; i < nthreads; i++) pthread_join(th[i], 0);
            pthread_barrier_destroy(&layer_done);
            double bytes = (double)layers * (ROWS / nthreads / 8 * 8) * nthreads * K * (mode == 4 ? 2 : 1);
            printf("{\"kernel\": \"%s\", \"threads\": %d, \"pf\": %d, \"pages\": %d, \"gb_s\": %.1f}\n", names[mode], nthreads,
                   pf, pages, bytes / (now() - t0) / 1e9);
            fflush(stdout);
        }
    return 0;
}
