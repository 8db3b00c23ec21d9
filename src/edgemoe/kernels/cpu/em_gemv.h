/* Few-token matrix-vector products: bf16 weights × fp32 activations, fp32 accumulation.
 *
 * Memory-bound at batch 1, so the weights are read once with the widest loads and
 * converted for free: a 32-bit lane holding two bf16 weights (w[2j] low, w[2j+1] high)
 * becomes fp32 w[2j] by a left shift of 16 and fp32 w[2j+1] by masking the low half.
 * The activations are stored pre-split to match ("split layout": per block of 2*VW
 * values, the VW even-indexed ones then the VW odd-indexed ones), so the inner loop is
 * load, shift, and, FMA — no shuffles. Four weight rows share each activation load.
 *
 * gemv4(w, xs, xs_stride, nt, K, pf, dots): dots[r*nt + t] = sum_k w[r][k] * x_t[k]
 * for r < 4 rows and t < nt <= EM_NT tokens; xs holds nt rows in split layout,
 * zero-padded to a multiple of 2*VW; w[r] + pf is row r of the next group.
 */
#ifndef EM_GEMV_H
#define EM_GEMV_H

#include <stdint.h>
#include <string.h>

/* Prefetch the same column of the next row group (`pf` weights on): a row is one or
 * two 4 KiB pages, too short for the hardware prefetcher to ramp up on, so each group
 * would start cold. Measured single-core: 53% → 70% of a plain read's bandwidth. */
#ifndef EM_PF_LOCALITY
#define EM_PF_LOCALITY 3 /* into L1 */
#endif
#define EM_PREFETCH(p, pf) __builtin_prefetch((const char *)((p) + (pf)), 0, EM_PF_LOCALITY)

static inline float em_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(EM_ISA_AVX512) || defined(EM_ISA_AMX)
#include <immintrin.h>
#define EM_VW 16
#define EM_NT 4

/* Accumulators are named variables, not an array: GCC otherwise stores the whole
 * array to the stack on every iteration. a<r><t>: row r, token t. */
#define EM_FMA2(a, xe, xo) a = _mm512_fmadd_ps(wo, xo, _mm512_fmadd_ps(we, xe, a))
#define EM_ROW512(r)                                                                \
    {                                                                               \
        EM_PREFETCH(w[r] + k, pf);                                                  \
        __m512i v = _mm512_maskz_loadu_epi16(m, w[r] + k);                          \
        __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));                  \
        __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));                   \
        EM_FMA2(a##r##0, xe0, xo0);                                                 \
        if (nt > 1) EM_FMA2(a##r##1, xe1, xo1);                                     \
        if (nt > 2) EM_FMA2(a##r##2, xe2, xo2);                                     \
        if (nt > 3) EM_FMA2(a##r##3, xe3, xo3);                                     \
    }

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, int64_t pf, float *dots) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512 a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int k = 0; k < K; k += 32) {
        /* NOTE: the tail block loads only K-k weights (masked); xs is zero there. */
        __mmask32 m = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1u);
        __m512 xe0 = _mm512_loadu_ps(xs + k), xo0 = _mm512_loadu_ps(xs + k + 16);
        __m512 xe1 = z, xo1 = z, xe2 = z, xo2 = z, xe3 = z, xo3 = z;
        if (nt > 1) xe1 = _mm512_loadu_ps(xs + xss + k), xo1 = _mm512_loadu_ps(xs + xss + k + 16);
        if (nt > 2) xe2 = _mm512_loadu_ps(xs + 2 * xss + k), xo2 = _mm512_loadu_ps(xs + 2 * xss + k + 16);
        if (nt > 3) xe3 = _mm512_loadu_ps(xs + 3 * xss + k), xo3 = _mm512_loadu_ps(xs + 3 * xss + k + 16);
        EM_ROW512(0) EM_ROW512(1) EM_ROW512(2) EM_ROW512(3)
    }
    const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = _mm512_reduce_add_ps(acc[r][t]);
}

#elif defined(EM_ISA_AVX2)
#include <immintrin.h>
#define EM_VW 8
#define EM_NT 2 /* 16 ymm registers: 8 accumulators + 4 activations + 2 weights */

static inline float em_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define EM_FMA2_256(a, xe, xo) a = _mm256_fmadd_ps(wo, xo, _mm256_fmadd_ps(we, xe, a))
#define EM_ROW256(r)                                                                \
    {                                                                               \
        __m256i v;                                                                  \
        if (K - k >= 16) {                                                          \
            EM_PREFETCH(w[r] + k, pf);                                              \
            v = _mm256_loadu_si256((const __m256i *)(w[r] + k));                    \
        } else { /* tail: no 16-bit masked loads in AVX2 */                         \
            uint16_t buf[16] = {0};                                                 \
            memcpy(buf, w[r] + k, (size_t)(K - k) * 2);                             \
            v = _mm256_loadu_si256((const __m256i *)buf);                           \
        }                                                                           \
        __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                  \
        __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));                   \
        EM_FMA2_256(a##r##0, xe0, xo0);                                             \
        if (nt > 1) EM_FMA2_256(a##r##1, xe1, xo1);                                 \
    }

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, int64_t pf, float *dots) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int k = 0; k < K; k += 16) {
        __m256 xe0 = _mm256_loadu_ps(xs + k), xo0 = _mm256_loadu_ps(xs + k + 8), xe1 = z, xo1 = z;
        if (nt > 1) xe1 = _mm256_loadu_ps(xs + xss + k), xo1 = _mm256_loadu_ps(xs + xss + k + 8);
        EM_ROW256(0) EM_ROW256(1) EM_ROW256(2) EM_ROW256(3)
    }
    const __m256 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = em_hsum256(acc[r][t]);
}

#else /* portable C; split layout with VW = 1 is the plain layout */
#define EM_VW 1
#define EM_NT 4

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, int64_t pf, float *dots) {
    float acc[4][EM_NT] = {{0}};
    (void)pf; /* plain C: left to the hardware prefetcher */
    for (int k = 0; k < K; k++)
        for (int r = 0; r < 4; r++) {
            float wk = em_bf16_to_f32(w[r][k]);
            for (int t = 0; t < nt; t++) acc[r][t] += wk * xs[t * xss + k];
        }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = acc[r][t];
}
#endif

/* Position of element i in the split layout. */
static inline int64_t em_split_pos(int64_t i) {
    int64_t b = i / (2 * EM_VW), j = i % (2 * EM_VW);
    return b * 2 * EM_VW + (j & 1) * EM_VW + j / 2;
}

/* Constant token counts let the compiler keep the accumulators in registers. */
static void em_gemv4_1(const uint16_t *const *w, const float *xs, int64_t s, int K, int64_t pf, float *d) { em_gemv4_impl(w, xs, s, 1, K, pf, d); }
static void em_gemv4_2(const uint16_t *const *w, const float *xs, int64_t s, int K, int64_t pf, float *d) { em_gemv4_impl(w, xs, s, 2, K, pf, d); }
#if EM_NT >= 4
static void em_gemv4_3(const uint16_t *const *w, const float *xs, int64_t s, int K, int64_t pf, float *d) { em_gemv4_impl(w, xs, s, 3, K, pf, d); }
static void em_gemv4_4(const uint16_t *const *w, const float *xs, int64_t s, int K, int64_t pf, float *d) { em_gemv4_impl(w, xs, s, 4, K, pf, d); }
#endif

static void em_gemv4(const uint16_t *const *w, const float *xs, int64_t xss, int nt, int K, int64_t pf, float *dots) {
    switch (nt) {
    case 1: em_gemv4_1(w, xs, xss, K, pf, dots); break;
    case 2: em_gemv4_2(w, xs, xss, K, pf, dots); break;
#if EM_NT >= 4
    case 3: em_gemv4_3(w, xs, xss, K, pf, dots); break;
    default: em_gemv4_4(w, xs, xss, K, pf, dots); break;
#endif
    }
}

#endif
