//! GPU suite: module images as nvcc writes them. `crates/command/tests/images/build.sh` builds
//! `kernels.cu` into a cubin, PTX and fatbins (plain and compressed) with the machine's nvcc; each
//! image must pass `check_image`, load on the driver, and take exactly the layouts its kernels
//! declare: the right parameter sizes are accepted and a short layout is refused. Without nvcc
//! (or the script) the test reports itself skipped.

use std::path::PathBuf;
use std::process::Command;

use cuhal::CommandBufferMode;
use cuhal_command::{Error, check_image};
use cuhal_gpu_tests::device_support::open;
use cuhal_gpu_tests::skip::skip;

/// Each kernel of `kernels.cu` and its parameters' sizes in bytes.
const KERNELS: &[(&str, &[usize])] = &[
    ("three_params", &[8, 4, 8]),
    ("with_struct", &[8, 16, 1, 8]),
    ("no_params", &[]),
];

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn nvcc_images_pass_the_checks_load_and_keep_their_layouts() {
    let script = PathBuf::from("crates/command/tests/images/build.sh");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "/usr/local/cuda/bin/nvcc".into());
    if !script.exists() || Command::new(&nvcc).arg("--version").output().is_err() {
        skip("needs nvcc and crates/command/tests/images/build.sh (run from the repository root)");
        return;
    }
    let out = std::env::temp_dir().join(format!("cuhal-images-{}", std::process::id()));
    let built = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .env("NVCC", &nvcc)
        .output()
        .expect("running build.sh");
    assert!(
        built.status.success(),
        "build.sh failed: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let device = open(CommandBufferMode::Graph, 1);
    let mut images = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        images += 1;
        let module = if name.ends_with(".ptx") {
            let text = String::from_utf8(bytes).unwrap();
            device.load_ptx(&text)
        } else {
            assert_eq!(check_image(&bytes), Ok(()), "{name}");
            device.load_cubin(&bytes)
        }
        .unwrap_or_else(|e| panic!("{name} does not load: {e}"));
        for &(kernel, sizes) in KERNELS {
            let function = module.function(kernel).unwrap();
            if let Some(known) = function.parameter_sizes() {
                assert_eq!(known, sizes, "{name}: {kernel} as the driver reports it");
            }
            function
                .with_parameter_sizes(sizes)
                .unwrap_or_else(|e| panic!("{name}: {kernel} refuses its own layout: {e}"));
            if !sizes.is_empty() {
                let short = &sizes[..sizes.len() - 1];
                assert!(
                    matches!(
                        function.with_parameter_sizes(short),
                        Err(Error::ArgumentMismatch { .. } | Error::UnverifiableParameters { .. })
                    ),
                    "{name}: {kernel} takes a short layout"
                );
            }
        }
    }
    assert!(images >= 3, "build.sh wrote {images} images");
    let _ = std::fs::remove_dir_all(&out);
}
