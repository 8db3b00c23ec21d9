/* Quantised weights → their exact bf16 values, 32 at a time (AVX-512 BW/BF16): e4m3 by
 * integer operations (~7 vector uops per 32 weights, no fp32 product; an e4m3 value is
 * exact in bf16: 4 significant bits, exponents 2^-9..2^8), int8 through fp32 (7 bits,
 * exact). Standalone (intrinsics only): the AMX blocked path's tiles (em_qjit.h) and
 * scripts/amx_tile_probe.c include it.
 */
#ifndef EM_QEXACT_H
#define EM_QEXACT_H

#include <immintrin.h>
#include <stdint.h>

/* e4m3 subnormals m · 2^-9 (m = 1..7) as bf16, indexed by the byte's low bits. */
static inline __m512i em_e4m3_sub_lut(void) {
    static const uint16_t lut[32] __attribute__((aligned(64))) = {0,      0x3B00, 0x3B80, 0x3BC0,
                                                                  0x3C00, 0x3C20, 0x3C40, 0x3C60};
    return _mm512_load_si512(lut);
}

/* 32 e4m3 bytes (sign-extended to 16 bits) → their exact bf16 values: a normal's exponent
 * rebiased by 127 − 7 and its mantissa moved up 4; a subnormal's (exponent 0) from the
 * table; the sign kept. */
static inline __m512i em_e4m3_bf16(__m512i x, __m512i sub) {
    __m512i n = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(x, 4), _mm512_set1_epi16(0x07F0)),
                                 _mm512_set1_epi16(0x3C00));
    n = _mm512_mask_permutexvar_epi16(n, _mm512_testn_epi16_mask(x, _mm512_set1_epi16(0x78)), x, sub);
    return _mm512_ternarylogic_epi32(n, x, _mm512_set1_epi16((short)0x8000), 0xF8); /* n | (x & sign) */
}

/* 32 weights of row w from k0 (zeros past K) → their exact bf16 values at out. */
static inline __attribute__((always_inline)) void em_q32_exact(const uint8_t *w, int k0, int K, const int fp8,
                                                               __m512i sub, uint16_t *out) {
    __m256i b = K - k0 >= 32 ? _mm256_loadu_si256((const __m256i *)(w + k0))
                             : _mm256_maskz_loadu_epi8((__mmask32)((1ull << (K - k0)) - 1u), w + k0);
    if (fp8) {
        _mm512_store_si512(out, em_e4m3_bf16(_mm512_cvtepi8_epi16(b), sub));
    } else {
        __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
        _mm512_store_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

#endif
