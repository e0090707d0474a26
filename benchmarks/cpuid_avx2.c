// Used by benchmarks/kokoro_plans.py --avx2: emulates an AVX2-only x86 CPU for ONNX Runtime.
// MLAS picks its kernels from CPUID at load and has no switch to ignore AVX-512; with
// CPUID faulting (arch_prctl ARCH_SET_CPUID, the "cpuid_fault" flag) every CPUID traps to
// the SIGSEGV handler below, which runs it for real and clears the AVX-512, AMX and
// AVX-VNNI bits. gcc -O2 -shared -fPIC -o cpuid_avx2.so cpuid_avx2.c; LD_PRELOAD it.
// LD_PRELOAD shim: hide AVX-512, AMX and AVX-VNNI from CPUID.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static int set_cpuid(int on) { return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }

static void handler(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = (ucontext_t *)ctx;
    greg_t *r = uc->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)r[REG_RIP];
    if (ip[0] != 0x0f || ip[1] != 0xa2) { signal(SIGSEGV, SIG_DFL); raise(SIGSEGV); return; }
    uint32_t leaf = (uint32_t)r[REG_RAX], sub = (uint32_t)r[REG_RCX], a, b, c, d;
    set_cpuid(1);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(sub));
    set_cpuid(0);
    if (leaf == 7 && sub == 0) {
        b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
        c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        a &= ~((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23));
    }
    r[REG_RAX] = a; r[REG_RBX] = b; r[REG_RCX] = c; r[REG_RDX] = d;
    r[REG_RIP] += 2;
    (void)sig; (void)si;
}

__attribute__((constructor)) static void init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    if (set_cpuid(0) != 0) { perror("cpuid_avx2: ARCH_SET_CPUID"); return; }
    if (getenv("CPUID_AVX2_VERBOSE")) fprintf(stderr, "cpuid_avx2: AVX-512/AMX/AVX-VNNI hidden\n");
}
