/* Many-token products (n >= gemm_min_tokens): bf16 × bf16 with fp32 accumulation.
 *
 * Activations are packed per job in "pair layout": xp[p*np + t] is one 32-bit lane
 * holding (x_t[2p] low, x_t[2p+1] high) as bf16, tokens padded to np (a multiple of
 * 16), pairs zero-padded to a multiple of 16. Weight rows are read in place (row-major,
 * K contiguous): no repacking of the 9 MB of an expert.
 *
 * - AVX-512 BF16: lanes are 16 tokens; a weight pair is broadcast and vdpbf16ps
 *   accumulates 2 products per lane. 12 rows × 32 tokens of accumulators.
 * - AMX: A tile = 16 weight rows × 32 k (loaded straight from the weights, stride K),
 *   B tile = 16 pairs × 16 tokens of xp, C = 16 rows × 16 tokens fp32.
 *   EM_AMX_EMULATE replaces the tile instructions by plain C with the same semantics,
 *   so the tiling logic is tested on CPUs without AMX.
 */
#ifndef EM_GEMM_H
#define EM_GEMM_H

#include <stdint.h>
#include <string.h>

#if defined(EM_ISA_AVX512) || defined(EM_ISA_AMX)
#define EM_HAS_GEMM 1
#else
#define EM_HAS_GEMM 0
#endif

/* fp32 → bf16, round to nearest even (NaN stays NaN). */
static inline uint16_t em_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#if defined(EM_ISA_AVX512)
#include <immintrin.h>
#define EM_GR 12 /* rows per microkernel */

/* out[r*32 + v*16 + lane] = sum_k w[r][k] * x_{t0+16v+lane}[k], r < 12, v < tv (1 or 2). */
static inline __attribute__((always_inline)) void em_gemm12_impl(const uint16_t *const *w, const uint32_t *xp,
                                                                  int64_t np, int t0, const int tv, int K, float *out) {
    __m512 acc[EM_GR][2];
    for (int r = 0; r < EM_GR; r++)
        for (int v = 0; v < tv; v++) acc[r][v] = _mm512_setzero_ps();
    const int P = (K + 1) / 2;
    for (int p = 0; p < P; p++) {
        const uint32_t *xr = xp + (int64_t)p * np + t0;
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(xr);
        __m512bh x1 = tv > 1 ? (__m512bh)_mm512_loadu_si512(xr + 16) : x0;
        const int last = 2 * p + 1 >= K; /* K odd: the pair's high half is past the row */
        for (int r = 0; r < EM_GR; r++) {
            uint32_t wv = 0;
            if (!last)
                memcpy(&wv, w[r] + 2 * p, 4);
            else
                wv = w[r][2 * p];
            if ((p & 15) == 0) _mm_prefetch((const char *)(w[r] + 2 * p) + 512, _MM_HINT_T0);
            __m512bh wb = (__m512bh)_mm512_set1_epi32((int)wv);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], wb, x0);
            if (tv > 1) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], wb, x1);
        }
    }
    for (int r = 0; r < EM_GR; r++)
        for (int v = 0; v < tv; v++) _mm512_storeu_ps(out + r * 32 + v * 16, acc[r][v]);
}

static void em_gemm12_1(const uint16_t *const *w, const uint32_t *xp, int64_t np, int t0, int K, float *o) { em_gemm12_impl(w, xp, np, t0, 1, K, o); }
static void em_gemm12_2(const uint16_t *const *w, const uint32_t *xp, int64_t np, int t0, int K, float *o) { em_gemm12_impl(w, xp, np, t0, 2, K, o); }
#endif

#if defined(EM_ISA_AMX)
#if defined(EM_AMX_EMULATE)
/* Plain-C tiles: 8 registers of 16 rows × 64 bytes, as configured below. */
typedef struct { uint8_t b[16][64]; } __attribute__((aligned(64))) em_tile_t;
static __thread em_tile_t em_tiles[8];

static void em_tile_load(int t, const void *src, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy(em_tiles[t].b[r], (const uint8_t *)src + r * stride, 64);
}
static void em_tile_store(int t, void *dst, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy((uint8_t *)dst + r * stride, em_tiles[t].b[r], 64);
}
static void em_tile_zero(int t) { memset(&em_tiles[t], 0, sizeof(em_tile_t)); }
static float em_bf(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* TDPBF16PS: C[m][n] += sum_p A[m][2p]*B[p][2n] + A[m][2p+1]*B[p][2n+1] */
static void em_tile_dp(int c, int a, int b) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float cv;
            memcpy(&cv, &em_tiles[c].b[m][4 * n], 4);
            for (int p = 0; p < 16; p++) {
                cv += em_bf(&em_tiles[a].b[m][4 * p]) * em_bf(&em_tiles[b].b[p][4 * n]);
                cv += em_bf(&em_tiles[a].b[m][4 * p + 2]) * em_bf(&em_tiles[b].b[p][4 * n + 2]);
            }
            memcpy(&em_tiles[c].b[m][4 * n], &cv, 4);
        }
}
#define EM_TLOAD(t, p, s) em_tile_load(t, p, s)
#define EM_TSTORE(t, p, s) em_tile_store(t, p, s)
#define EM_TZERO(t) em_tile_zero(t)
#define EM_TDP(c, a, b) em_tile_dp(c, a, b)
static void em_amx_config(void) {}
static void em_amx_release(void) {}
#else
#include <immintrin.h>
#define EM_TLOAD(t, p, s) _tile_loadd(t, p, s)
#define EM_TSTORE(t, p, s) _tile_stored(t, p, s)
#define EM_TZERO(t) _tile_zero(t)
#define EM_TDP(c, a, b) _tile_dpbf16ps(c, a, b)

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) em_tilecfg;

/* NOTE: tile configuration is per thread; every thread loads it before its tiles. */
static void em_amx_config(void) {
    em_tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}
static void em_amx_release(void) { _tile_release(); }
#endif

/* Source of an A tile: 16 rows of w (row stride ld elements) from column k0. Direct
 * when whole; else copied, zero-padded, into buf (rows past nvalid, columns past K). */
static inline const void *em_a_src(const uint16_t *w, int64_t ld, int nvalid, int k0, int K, uint16_t *buf,
                                   int64_t *stride) {
    if (nvalid == 16 && k0 + 32 <= K) {
        *stride = ld * 2;
        return w + k0;
    }
    int kw = K - k0 < 32 ? K - k0 : 32;
    memset(buf, 0, 16 * 64);
    for (int r = 0; r < nvalid; r++) memcpy(buf + r * 32, w + r * ld + k0, (size_t)kw * 2);
    *stride = 64;
    return buf;
}

/* A k-step's tile products: A tiles 4, 5 (16 rows each, from a0 / a1 at byte strides s0 /
 * s1) × B tile 6 (pairs of x at b, 16 tokens; and tile 7, the next 16, when `two`) into C
 * tiles 0..3 (C = 2·row tile + token tile). */
static inline __attribute__((always_inline)) void em_amx_step(const void *a0, int64_t s0, const void *a1, int64_t s1,
                                                              const uint32_t *b, int64_t np, int two) {
    EM_TLOAD(4, a0, s0);
    EM_TLOAD(5, a1, s1);
    EM_TLOAD(6, b, np * 4);
    EM_TDP(0, 4, 6);
    EM_TDP(2, 5, 6);
    if (two) {
        EM_TLOAD(7, b + 16, np * 4);
        EM_TDP(1, 4, 7);
        EM_TDP(3, 5, 7);
    }
}

#ifndef EM_AMX_PF
#define EM_AMX_PF 256 /* weights ahead a row's prefetch reads (8 k-steps) */
#endif
#ifndef EM_AMX_PF_LOCALITY
#define EM_AMX_PF_LOCALITY 3
#endif
/* C tiles 0..3 = rows (a0: 16 rows, a1: 16 rows) × tokens (t0, t0+16 if two).
 * out[(blk*16 + r)*32 + v*16 + lane], blk 0 = a0 rows, 1 = a1 rows. */
static void em_amx_2x2(const uint16_t *a0, int n0, const uint16_t *a1, int n1, int64_t ld, const uint32_t *xp,
                       int64_t np, int t0, int two, int K, float *out) {
    uint16_t buf0[16 * 32], buf1[16 * 32];
    EM_TZERO(0);
    EM_TZERO(1);
    EM_TZERO(2);
    EM_TZERO(3);
    for (int k0 = 0; k0 < K; k0 += 32) {
        int64_t s0, s1;
        const void *p0 = em_a_src(a0, ld, n0, k0, K, buf0, &s0);
        const void *p1 = em_a_src(a1, ld, n1, k0, K, buf1, &s1);
        const uint32_t *b = xp + (int64_t)(k0 / 2) * np + t0;
#if !defined(EM_AMX_EMULATE)
        /* 32 weight rows stream at once: more than the hardware prefetcher follows. */
        if (k0 + EM_AMX_PF < K)
            for (int r = 0; r < 16; r++) {
                __builtin_prefetch((const char *)(a0 + r * ld + k0 + EM_AMX_PF), 0, EM_AMX_PF_LOCALITY);
                __builtin_prefetch((const char *)(a1 + r * ld + k0 + EM_AMX_PF), 0, EM_AMX_PF_LOCALITY);
            }
#endif
        em_amx_step(p0, s0, p1, s1, b, np, two);
    }
    EM_TSTORE(0, out, 32 * 4);
    EM_TSTORE(2, out + 16 * 32, 32 * 4);
    if (two) {
        EM_TSTORE(1, out + 16, 32 * 4);
        EM_TSTORE(3, out + 16 * 32 + 16, 32 * 4);
    }
}
#endif

#endif
