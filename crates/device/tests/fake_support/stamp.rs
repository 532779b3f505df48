//! The fake driver's stamping kernel ([`STAMP_KERNEL`]: `(cuhal_zone_stamp* zone, u64 begin,
//! u64 end)`, which folds the readings it is given into its slot as the header's reductions do).

use cuhal::{Device, Function};
use cuhal_fake_driver::module::STAMP_KERNEL;

/// The stamping kernel, loaded from a module that declares it with its parameters.
pub fn stamp_kernel(device: &Device) -> Function {
    let ptx = format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry {STAMP_KERNEL}(.param .u64 zone, .param .u64 begin, .param .u64 end) {{ ret; }}\n"
    );
    device
        .load_ptx(&ptx)
        .unwrap()
        .function(STAMP_KERNEL)
        .unwrap()
}
