// File: kernels/cpu/cpu_relax.h
//
// CpuRelax(): the spin-wait hint, for loops that poll a flag another thread or process sets
// (the CPU pool's idle threads, a shared-memory hop's receiver). Without it a polling loop
// runs at full issue rate, which takes execution resources from the other hardware thread
// of the same core (often a busy stage on a VM's vCPUs) and ends in a pipeline flush when
// the flag changes.
#ifndef RINGSERVE_KERNELS_CPU_CPU_RELAX_H_
#define RINGSERVE_KERNELS_CPU_CPU_RELAX_H_

namespace ring::cpu {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_CPU_RELAX_H_
