//! Facts about the host for the report's header, read from `/proc` where it exists.

/// The NVIDIA kernel module's version ("580.95.05") from `/proc/driver/nvidia/version`.
pub fn nvidia_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_nvrm_version(&text)
}

/// The first dotted number after "Kernel Module" on the `NVRM version:` line (the proprietary
/// and the open module word that line differently).
pub fn parse_nvrm_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let rest = &line[line.find("Kernel Module")? + "Kernel Module".len()..];
    rest.split_whitespace()
        .find(|t| {
            t.starts_with(|c: char| c.is_ascii_digit())
                && t.contains('.')
                && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_owned)
}

/// The CPU model from `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    parse_cpu_model(&text)
}

/// The first `model name` of a `/proc/cpuinfo` text.
pub fn parse_cpu_model(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_owned())
    })
}

/// Logical CPUs this process may use.
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrm_line_gives_the_module_version() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  \
                    Release Build  (dvs-builder@U16)  Thu Oct  2 2025\nGCC version:  gcc 12\n";
        assert_eq!(parse_nvrm_version(text).as_deref(), Some("580.159.03"));
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n";
        assert_eq!(parse_nvrm_version(text).as_deref(), Some("550.54.14"));
        assert_eq!(parse_nvrm_version("GCC version: 12\n"), None);
        assert_eq!(
            parse_nvrm_version("NVRM version: NVIDIA Kernel Module for x86_64 Release\n"),
            None
        );
    }

    #[test]
    fn cpu_model_is_the_first_model_name() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\
                    processor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            parse_cpu_model(text).as_deref(),
            Some("AMD EPYC 9654 96-Core Processor")
        );
        assert_eq!(parse_cpu_model("processor : 0\n"), None);
        assert!(logical_cpus() >= 1);
    }
}
