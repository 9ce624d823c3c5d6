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

#if defined(__x86_64__) || defined(_M_X64)
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
/// when `on`, and with IEEE subnormals when not: the flush bits are set to exactly that, whatever the thread (or
/// oneTBB, which hands a task arena's first caller's settings to its workers) had. The destructor puts back the
/// thread's earlier flush bits only; every other bit of the control register (rounding mode, exception masks, the
/// sticky exception flags raised meanwhile) is left as it is then. Writes the register only when the bits change.
/// Not copyable; use on the stack of the thread it applies to.
class subnormal_flush_scope {
public:
    explicit subnormal_flush_scope(bool on = true) noexcept {
#if defined(HYMIX_FLOAT_ENV_X86)
        const std::uint64_t now = _mm_getcsr();
        saved_ = now & mxcsr_bits;
        const std::uint64_t want = on ? mxcsr_bits : 0;
        if (saved_ != want) {
            _mm_setcsr(static_cast<unsigned>((now & ~mxcsr_bits) | want));
            changed_ = true;
        }
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        const std::uint64_t now = read_fpcr();
        saved_ = now & fpcr_fz;
        const std::uint64_t want = on ? fpcr_fz : 0;
        if (saved_ != want) {
            write_fpcr((now & ~fpcr_fz) | want);
            changed_ = true;
        }
#else
        (void)on;
#endif
    }
    ~subnormal_flush_scope() {
        if (!changed_) return;
#if defined(HYMIX_FLOAT_ENV_X86)
        _mm_setcsr(static_cast<unsigned>((_mm_getcsr() & ~mxcsr_bits) | saved_));
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        write_fpcr((read_fpcr() & ~fpcr_fz) | saved_);
#endif
    }
    subnormal_flush_scope(const subnormal_flush_scope&) = delete;
    subnormal_flush_scope& operator=(const subnormal_flush_scope&) = delete;

    /// Whether the current thread flushes subnormals now (on x86 both FTZ and DAZ must be set).
    static bool active() noexcept {
#if defined(HYMIX_FLOAT_ENV_X86)
        return (_mm_getcsr() & mxcsr_bits) == mxcsr_bits;
#elif defined(HYMIX_FLOAT_ENV_ARM64)
        return (read_fpcr() & fpcr_fz) != 0;
#else
        return false;
#endif
    }

private:
    static constexpr std::uint64_t mxcsr_bits = 0x8040;               // FTZ (bit 15) | DAZ (bit 6)
    static constexpr std::uint64_t fpcr_fz = std::uint64_t{1} << 24;  // FZ
#if defined(HYMIX_FLOAT_ENV_ARM64)
    // The "memory" clobbers keep the compiler from moving loads and stores across the switch; register-only float
    // arithmetic is not tracked, which is why the backend sets the scope around whole task bodies, not inside them.
    static std::uint64_t read_fpcr() noexcept {
        std::uint64_t v;
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(v) : : "memory");
        return v;
    }
    static void write_fpcr(std::uint64_t v) noexcept { __asm__ __volatile__("msr fpcr, %0" : : "r"(v) : "memory"); }
#endif
    [[maybe_unused]] std::uint64_t saved_ = 0;  // the flush bits before the scope
    bool changed_ = false;
};

}  // namespace hymix
