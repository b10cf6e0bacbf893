// File: kernels/cpu/quant_kernels_avx512.h
//
// Internal to kernels/cpu/quant_kernels.cc: the AVX-512 matmul kernel for 4-bit codes
// (mxfp4, nvfp4, affine 4-bit). It is compiled with function-level target attributes, so
// the rest of the build keeps its baseline flags (-mavx2); callers must check Supported()
// before calling anything else here.
//
// Lane layout: a chunk is 16 uint32 words (64 bytes, 128 codes). Nibble t of word j is
// looked up in lane j of vector t (a 16-entry fp32 table, vpermps, which reads only the
// low 4 bits of each lane, so code t needs one shift and no mask). x is permuted once per
// call to match: xp[128 c + 16 t + j] = x[128 c + 8 j + t] (PermuteNibble16).
#ifndef RINGSERVE_KERNELS_CPU_QUANT_KERNELS_AVX512_H_
#define RINGSERVE_KERNELS_CPU_QUANT_KERNELS_AVX512_H_

#include <cstdint>

namespace ring::cpu::avx512 {

constexpr int64_t kChunkWords = 16;
constexpr int64_t kChunkElems = 128;

// True when this build has the kernel and the CPU and OS support AVX-512F (cpuid, xgetbv).
bool Supported();

// x[0, n) (n a multiple of kChunkElems) into the lane layout above.
void PermuteNibble16(const float* x, int64_t n, float* xp);

// out[i] = sum over chunks [c0, c1) of row `w` and lanes j of
//   scale(lane) * sum_t xp[i][128 c + 16 t + j] * table[code t of word 16 c + j],
// for mb (1..4) rows of permuted x. `sc` holds the row's group scales (fp32) padded by 16
// readable floats; groups are 2^log2_wpg words (1 <= 2^log2_wpg).
// `next`: where prefetching continues past c1 (see PrefetchTarget in quant_kernels.h).
void Nibble16Row(const uint32_t* w, int64_t c0, int64_t c1, int mb, const float* const* xp,
                 const float* sc, int log2_wpg, const float* table, const uint8_t* next,
                 float* out);

}  // namespace ring::cpu::avx512

#endif  // RINGSERVE_KERNELS_CPU_QUANT_KERNELS_AVX512_H_
