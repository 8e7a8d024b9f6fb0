// Run-time CPU checks for the kernels compiled with their own target attributes, and the
// environment switches that turn such a kernel off (for tests and comparisons).
#pragma once

#include <cstdlib>
#include <cstring>

// Target attributes of the hand-vectorised kernels (the extension itself is built for the
// x86-64 baseline); such a kernel runs only after cpu_has_avx512 / cpu_has_avx2_fma said yes.
#define TSPP_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TSPP_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define TSPP_AVX2_TARGET __attribute__((target("avx2,fma")))

// Memory-bound row loops: one clone per instruction set, picked at load time (GCC function
// multi-versioning), since the baseline's 128-bit vectors leave most of an AVX-512 core idle.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TSPP_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
// Loops counting bits: popcnt is on every x86-64 CPU since 2008 but not in the baseline, where
// __builtin_popcountll is a call into libgcc.
#define TSPP_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define TSPP_ROW_CLONES
#define TSPP_POPCNT_CLONES
#endif
// For the templates a TSPP_ROW_CLONES function calls: inlined into each clone, so that they are
// compiled for its instruction set (a call out would run baseline code).
#define TSPP_INLINE_IN_CLONES __attribute__((always_inline)) inline

namespace torchsparse_pp {

// AVX-512 F / BW / VL, and with `bf16` also AVX512-BF16 (vdpbf16ps).
inline bool cpu_has_avx512(bool bf16) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && (!bf16 || __builtin_cpu_supports("avx512bf16"));
#else
  (void)bf16;
  return false;
#endif
}

// AVX2 with FMA3.
inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// True when the environment variable `name` is "1".
inline bool disabled_by_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace torchsparse_pp
