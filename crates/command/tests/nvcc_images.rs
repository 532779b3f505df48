//! Module images as nvcc writes them (`tests/images/`, built from `kernels.cu` by `build.sh`):
//! every one passes `check_image`, and the parameter counts read from the cubin and the PTX are
//! the kernels' own. Cut short anywhere, every binary image is refused.

use cuhal_command::{check_image, cubin_parameter_counts, ptx_parameter_counts};

/// Each kernel of `kernels.cu` and its parameter count.
const KERNELS: &[(&str, usize)] = &[("three_params", 3), ("with_struct", 4), ("no_params", 0)];

fn image(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/images")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sorted(mut counts: Vec<(String, usize)>) -> Vec<(String, usize)> {
    counts.sort();
    counts
}

fn expected() -> Vec<(String, usize)> {
    sorted(KERNELS.iter().map(|&(k, n)| (k.to_owned(), n)).collect())
}

#[test]
fn nvcc_images_pass_the_image_check() {
    for name in [
        "kernels.sm_90.cubin",
        "kernels.fatbin",
        "kernels.compressed.fatbin",
    ] {
        let bytes = image(name);
        assert_eq!(check_image(&bytes), Ok(()), "{name}");
        for len in 0..bytes.len() {
            assert!(
                check_image(&bytes[..len]).is_err(),
                "{name} cut to {len} of {} bytes passes",
                bytes.len()
            );
        }
    }
}

#[test]
fn parameter_counts_read_from_nvcc_images_are_the_kernels_own() {
    let cubin = image("kernels.sm_90.cubin");
    assert_eq!(cubin_parameter_counts(&cubin).map(sorted), Some(expected()));
    let ptx = String::from_utf8(image("kernels.compute_80.ptx")).unwrap();
    assert_eq!(sorted(ptx_parameter_counts(&ptx)), expected());
}
