//! cuhal's helper kernels for the fake's sm_90 device. The fake "compiles" any text with `.entry`
//! names, so a helper cubin is a text file (NUL-terminated: the fake reads images as C strings),
//! written once per test binary into a directory that `INDIRECT_HELPER_DIR_ENV` names.

use std::sync::Once;

/// Both helpers, as the real per-architecture cubins hold them.
pub const BOTH_HELPERS: &str = ".entry cuhal_indirect_apply(.param .u64 counts) { ret; }\n\
     .entry cuhal_bindings_apply(.param .u64 patches, .param .u32 count, .param .u64 done) { ret; }\0";

/// The indirect-dispatch helper alone (binding tables then patch on the host).
pub const INDIRECT_HELPER_ONLY: &str = ".entry cuhal_indirect_apply(.param .u64 counts) { ret; }\0";

/// Writes `image` as the sm_90 helper cubin into a directory of this process named after `tag`,
/// and points cuhal at it; the first call of a test binary wins.
pub fn install_helpers(tag: &str, image: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("cuhal-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("indirect_sm_90.cubin"), image).unwrap();
        // SAFETY: set once, before any test of this binary loads a driver or records; nothing in
        // the test binaries reads the environment through libc.
        unsafe { std::env::set_var(cuhal_command::INDIRECT_HELPER_DIR_ENV, &dir) };
    });
}
