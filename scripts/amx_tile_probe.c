/* Where the AMX blocked path's k-step goes (not the engine's kernel: kernels/cpu/ is).
 * On the GPU machine the quantised and bf16 blocked paths all ran at ~2.5–2.7 G weights a
 * second a core (docs/benchmarks.md, "The quantised blocked path converting as it goes"),
 * ~300 ns for a k-step of 32 rows × 32 k where two TDPBF16PS need ~16 cycles each. This
 * times the k-step built up one piece at a time, each mode alone, per thread:
 *   tdp         the tile products only (A and B loaded once): two (16 tokens) or four
 *               (32) accumulator chains
 *   tdp_alt     the same, 16 tokens, alternating C tiles 0/2 and 1/3 step by step (half
 *               as long a chain): is a product waiting on the last one?
 *   load_a      + A's two tiles loaded each step from a fixed L1 buffer
 *   load_ab     + B loaded each step from the packed activations (64 KB at 16 tokens,
 *               128 KB at 32: L2), walking k as the kernel does
 *   conv        the fp8 conversion alone: 32 rows × 32 bytes from a 64 KB group (L2) into
 *               a tile buffer (em_qexact.h, the kernel's own code)
 *   conv_tiles  conversion + load_ab: the kernel's k-step, weights from L2
 *   conv_dram   the same, weights streaming from a pool in RAM (prefetched 256 bytes on)
 *   bf16_dram   the bf16 path's k-step: A's tiles straight from bf16 rows in RAM
 *               (prefetched 256 weights on), B as load_ab
 * One JSON line a mode: ns a k-step, G weights a second a thread and for all threads.
 * Compare thread counts too: a compute-bound mode (tdp, conv) slower a thread at 16 threads
 * than at 8 means two of the VM's "cores" share one physical core.
 *
 *   cc -O3 -march=native -Isrc/edgemoe/kernels/cpu -o /tmp/amx_probe scripts/amx_tile_probe.c -lpthread
 *   /tmp/amx_probe THREADS TOKENS SECONDS      (e.g. 1 16 0.3, then 16 16 0.3)
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef EM_ISA_AMX
#define EM_ISA_AMX 1
#endif
#include "em_gemm.h"   /* the kernel's tile configuration and k-step (em_amx_config, em_amx_step) */
#include "em_qexact.h" /* and its conversion */

#define K 2048               /* a gate_up row (Qwen3-30B-A3B's hidden size) */
#define GROUP (32 * K)       /* a k-step's 32 rows, fp8: 64 KB */
#define POOL_BYTES (64 << 20) /* each thread's weights in RAM */

enum { TDP, TDP_ALT, LOAD_A, LOAD_AB, CONV, CONV_TILES, CONV_DRAM, BF16_DRAM, MODES };
static const char *NAMES[MODES] = {"tdp", "tdp_alt", "load_a", "load_ab", "conv", "conv_tiles", "conv_dram", "bf16_dram"};

static int nthreads, tokens;
static double seconds;
static pthread_barrier_t barrier;
static double ns_per_step[256][MODES];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    uint8_t *pool;     /* fp8 rows in RAM */
    uint16_t *pool16;  /* bf16 rows in RAM */
    uint8_t *group;    /* one fp8 group (L2) */
    uint32_t *xp;      /* packed activations: K/2 pairs × np tokens */
    uint16_t a[2][16 * 32] __attribute__((aligned(64)));
    volatile float sink;
} state;

/* A k-step's conversion of the 32 rows at w (row stride K) from k0 into st->a: the
 * kernel's own per-row conversion (em_q32_exact). */
static inline void convert(state *st, const uint8_t *w, int k0, __m512i sub) {
    for (int r = 0; r < 32; r++) em_q32_exact(w + r * K, k0, K, 1, sub, st->a[r / 16] + (r % 16) * 32);
}

/* The k-step's products: A tiles 4, 5 × B tile 6 (and 7: 32 tokens) into C tiles 0..3. */
static inline void tdp_all(int two) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
    }
}

/* A's tiles from the conversion's buffers, B's from the packed activations at b, the
 * products: the kernel's own k-step. */
static inline void products(state *st, const uint32_t *b, int np, int two) {
    em_amx_step(st->a[0], 64, st->a[1], 64, b, np, two);
}

/* k-steps of `mode` until `seconds` pass; returns ns a k-step. */
static double run_mode(state *st, int mode) {
    const int np = tokens <= 16 ? 16 : 32, two = np > 16;
    const __m512i sub = em_e4m3_sub_lut();
    const size_t groups = POOL_BYTES / GROUP;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, st->a[0], 64);
    _tile_loadd(5, st->a[1], 64);
    _tile_loadd(6, st->xp, np * 4);
    _tile_loadd(7, st->xp + 16, np * 4);
    long steps = 0;
    size_t g = 0;
    double t0 = now(), t1 = t0;
    while (t1 - t0 < seconds) {
        for (int k0 = 0; k0 < K; k0 += 32, steps++) { /* one group of 32 rows, 64 k-steps */
            const uint32_t *b = st->xp + (size_t)(k0 / 2) * np;
            const uint8_t *w = mode == CONV_DRAM ? st->pool + g * GROUP : st->group;
            switch (mode) {
            case TDP:
                tdp_all(two);
                break;
            case TDP_ALT:
                if (k0 & 32) {
                    _tile_dpbf16ps(1, 4, 6);
                    _tile_dpbf16ps(3, 5, 6);
                } else {
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(2, 5, 6);
                }
                break;
            case LOAD_A:
                _tile_loadd(4, st->a[0], 64);
                _tile_loadd(5, st->a[1], 64);
                tdp_all(two);
                break;
            case LOAD_AB:
                products(st, b, np, two);
                break;
            case CONV:
                convert(st, w, k0, sub);
                break;
            case CONV_TILES:
            case CONV_DRAM:
                if (mode == CONV_DRAM && (k0 & 63) == 0 && k0 + 256 < K)
                    for (int r = 0; r < 32; r++) __builtin_prefetch(w + r * K + k0 + 256, 0, 3);
                convert(st, w, k0, sub);
                products(st, b, np, two);
                break;
            case BF16_DRAM: {
                const uint16_t *w16 = st->pool16 + g * 32 * K;
                if (k0 + 256 < K)
                    for (int r = 0; r < 32; r++) __builtin_prefetch(w16 + r * K + k0 + 256, 0, 3);
                em_amx_step(w16 + k0, K * 2, w16 + 16 * K + k0, K * 2, b, np, two);
                break;
            }
            }
        }
        g = (g + 1) % (mode == BF16_DRAM ? groups / 2 : groups);
        t1 = now();
    }
    float out[16 * 16] __attribute__((aligned(64)));
    _tile_stored(0, out, 64); st->sink += out[0]; /* keep the products */
    return (t1 - t0) * 1e9 / (double)steps;
}

static void *worker(void *arg) {
    const int me = (int)(intptr_t)arg;
    state *st = aligned_alloc(64, sizeof(state));
    st->pool = aligned_alloc(4096, POOL_BYTES), st->pool16 = aligned_alloc(4096, POOL_BYTES);
    st->group = aligned_alloc(4096, GROUP), st->xp = aligned_alloc(64, (size_t)K / 2 * 32 * 4);
    for (size_t i = 0; i < POOL_BYTES; i++) st->pool[i] = (uint8_t)(i * 37 + me);
    for (size_t i = 0; i < POOL_BYTES / 2; i++) st->pool16[i] = 0x3F80 | (uint16_t)(i & 0x7F);
    for (size_t i = 0; i < GROUP; i++) st->group[i] = (uint8_t)(i * 11);
    for (size_t i = 0; i < (size_t)K / 2 * 32; i++) st->xp[i] = 0x3F803F80u;
    memset(st->a, 0, sizeof(st->a));
    em_amx_config();
    for (int m = 0; m < MODES; m++) {
        pthread_barrier_wait(&barrier); /* every thread runs a mode at once */
        ns_per_step[me][m] = run_mode(st, m);
    }
    em_amx_release();
    return NULL;
}

int main(int argc, char **argv) {
    (void)em_amx_2x2; /* em_gemm.h's whole-row kernel: not probed here */
    nthreads = argc > 1 ? atoi(argv[1]) : 1;
    tokens = argc > 2 ? atoi(argv[2]) : 16;
    seconds = argc > 3 ? atof(argv[3]) : 0.3;
    if (nthreads < 1 || nthreads > 256 || (tokens != 16 && tokens != 32)) {
        fprintf(stderr, "usage: %s THREADS(1..256) TOKENS(16|32) SECONDS\n", argv[0]);
        return 2;
    }
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
        perror("AMX tile state refused");
        return 1;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    pthread_t th[256];
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    for (int m = 0; m < MODES; m++) {
        double sum = 0;
        for (int t = 0; t < nthreads; t++) sum += ns_per_step[t][m];
        const double ns = sum / nthreads, gw = 1024.0 / ns; /* a k-step: 32 rows × 32 weights */
        printf("{\"mode\": \"%s\", \"threads\": %d, \"tokens\": %d, \"ns_per_kstep\": %.1f, \"gw_s_thread\": %.2f, "
               "\"gw_s_all\": %.1f}\n", NAMES[m], nthreads, tokens, ns, gw, gw * nthreads);
    }
    return 0;
}
