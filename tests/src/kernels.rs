//! Hand-written PTX for the test kernels.
//!
//! The driver JIT-compiles PTX for the GPU it runs on, so these strings are all a test needs.
//! Each targets `sm_75` with PTX ISA 7.0 (CUDA 11.0): old enough for every driver cuhal
//! supports, and a target CUDA 13 still compiles (it dropped the Maxwell to Volta targets
//! before `sm_75`). Kernels take a global pointer as `.u64`, check their bounds, and use one
//! thread per element with a 1-D grid.

/// `fill_u32(u32 *ptr, u32 value, u32 n)`: `ptr[i] = value` for every `i < n`.
///
/// Launch with `ceil(n / block)` blocks of `block` threads; threads past `n` do nothing, so
/// the elements after `n` stay untouched.
pub const FILL_U32: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry fill_u32(
    .param .u64 fill_u32_ptr,
    .param .u32 fill_u32_value,
    .param .u32 fill_u32_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<7>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [fill_u32_ptr];
    ld.param.u32        %r1, [fill_u32_value];
    ld.param.u32        %r2, [fill_u32_n];

    // i = blockIdx.x * blockDim.x + threadIdx.x
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;

    // if (i >= n) return;
    setp.ge.u32         %p1, %r6, %r2;
    @%p1 bra            DONE;

    // ptr[i] = value  (byte offset i * 4, widened to 64 bits before the multiply)
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r6, 4;
    add.s64             %rd4, %rd2, %rd3;
    st.global.u32       [%rd4], %r1;

DONE:
    ret;
}
"#;

/// The entry point of [`FILL_U32`].
pub const FILL_U32_NAME: &str = "fill_u32";

/// PTX with a deliberate error (an unknown instruction on line 8 of the text, counting the
/// leading newline as line 1), for checking that the JIT's error log reaches the caller.
pub const BAD_PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry broken()
{
    cuhal_not_an_instruction.u32 %r1, 1;
    ret;
}
"#;

/// The token [`BAD_PTX`]'s error is about.
pub const BAD_PTX_TOKEN: &str = "cuhal_not_an_instruction";

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap structural checks that need no GPU; the suite proves the rest on one.
    #[test]
    fn kernels_are_well_formed_ptx_text() {
        for ptx in [FILL_U32, BAD_PTX] {
            assert!(ptx.contains(".version 7.0\n.target sm_75\n.address_size 64\n"));
            assert_eq!(ptx.matches('{').count(), ptx.matches('}').count());
            assert!(!ptx.contains('\0'), "PTX is passed as a C string");
        }
        assert!(FILL_U32.contains(&format!(".visible .entry {FILL_U32_NAME}(")));
        assert!(BAD_PTX.contains(BAD_PTX_TOKEN));
    }

    /// The parameter count cuhal reads from PTX text (so that no driver is probed past the last
    /// parameter) is exact for the suite's kernels.
    #[test]
    fn parameter_counts_are_read_from_the_ptx() {
        assert_eq!(
            cuhal_command::ptx_parameter_counts(FILL_U32),
            vec![(FILL_U32_NAME.to_owned(), 3)]
        );
        assert_eq!(
            cuhal_command::ptx_parameter_counts(BAD_PTX),
            vec![("broken".to_owned(), 0)]
        );
    }
}
