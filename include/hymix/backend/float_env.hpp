// Subnormal flushing for the CPU backend's threads. A subnormal float (|x| < 2^-126) costs a microcode assist of
// about a hundred cycles per instruction that reads or produces one on many x86 cores (Intel's above all), and the
// chunked scans make them as a matter of course: a decay of e^-10 per token, common in Gated DeltaNet and Mamba-2
// heads, multiplied along a 64-token chunk's forward substitution or segment sums falls below 2^-126 after a few
// steps. Their contribution to any output is below fp32 resolution, so the CPU backend runs its work with
// flush-to-zero (results) and denormals-are-zero (inputs) set, as PyTorch's torch.set_flush_denormal(True) does, and
// puts the calling thread's setting back afterwards. x86-64 (MXCSR FTZ and DAZ) and AArch64 (FPCR FZ); elsewhere
// nothing changes.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#define HYMIX_FLOAT_ENV_X86 1
#elif defined(__aarch64__)
#define HYMIX_FLOAT_ENV_ARM64 1
#endif

namespace hymix {

/// True where subnormal_flush_scope can change the floating-point environment (x86-64, AArch64).
inline constexpr bool can_flush_subnormals =
#if defined(HYMIX_FLOAT_ENV_X86) || defined(HYMIX_FLOAT_ENV_ARM64)
    true;
#else
    false;
#endif

/// While alive, the current thread computes with subnormal inputs read as zero and subnormal results flushed to zero
/// (when `on`); the destructor restores the thread's earlier setting. Writes the control register only when the
/// setting changes. Not copyable; use on the stack of the thread it applies to.
class subnormal_flush_scope {
public:
    explicit subnormal_flush_scope(bool on = true) noexcept {
        if (!on) return;
#if defined(HYMIX_FLOAT_ENV_X86)
        saved_ = _mm_getcsr();
        const std::uint64_t want = saved_ | mxcsr_bits;
        if (want != saved_) {
            _mm_setcsr(static_cast<unsigned>(want));
            changed_ = true;
        }
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        std::uint64_t fpcr;
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
        saved_ = fpcr;
        if (!(fpcr & fpcr_fz)) {
            fpcr |= fpcr_fz;
            __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
            changed_ = true;
        }
#endif
    }
    ~subnormal_flush_scope() {
        if (!changed_) return;
#if defined(HYMIX_FLOAT_ENV_X86)
        _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
#endif
    }
    subnormal_flush_scope(const subnormal_flush_scope&) = delete;
    subnormal_flush_scope& operator=(const subnormal_flush_scope&) = delete;

    /// Whether the current thread flushes subnormals now (either setting on x86 counts as no: both must be set).
    static bool active() noexcept {
#if defined(HYMIX_FLOAT_ENV_X86)
        return (_mm_getcsr() & mxcsr_bits) == mxcsr_bits;
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        std::uint64_t fpcr;
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
        return (fpcr & fpcr_fz) != 0;
#else
        return false;
#endif
    }

private:
    static constexpr std::uint64_t mxcsr_bits = 0x8040;         // FTZ (bit 15) | DAZ (bit 6)
    static constexpr std::uint64_t fpcr_fz = std::uint64_t{1} << 24;  // FZ
    std::uint64_t saved_ = 0;
    bool changed_ = false;
};

}  // namespace hymix
