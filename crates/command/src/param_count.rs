//! How many parameters each kernel of a module image takes, read from the image itself.
//!
//! `cuFuncGetParamInfo` reports one parameter's offset and size but not how many there are; only
//! CUDA 13.0 drivers export `cuFuncGetParamCount`. Without it the count used to be found by
//! probing past the last index until the driver answered `CUDA_ERROR_INVALID_VALUE`: one failing
//! call per kernel, which compute-sanitizer reports as an API error. The image the module was
//! loaded from says how many parameters each entry has, exactly, so the count comes from there:
//!
//! - PTX: the parameter list of each `.entry` (comments skipped).
//! - cubin (ELF): the `EIATTR_KPARAM_INFO` records of each `.nv.info.<kernel>` section, one per
//!   parameter, each with the parameter's ordinal; a kernel section with none has no parameters.
//!
//! A fatbin, or an image this reader does not understand, gives no counts, and then the driver is
//! probed as before.

/// A kernel's name and how many parameters it takes, as read from its module image.
pub type ParameterCounts = Vec<(String, usize)>;

/// The parameter count of every `.entry` in PTX text. Entries are found at the top level (outside
/// every `{ }` body), so a kernel body cannot fake one.
pub fn ptx_parameter_counts(ptx: &str) -> ParameterCounts {
    let text = strip_comments(ptx);
    let bytes = text.as_bytes();
    let mut counts = Vec::new();
    let mut depth = 0usize;
    let mut at = 0usize;
    while at < bytes.len() {
        match bytes[at] {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b'.' if depth == 0 && is_directive(bytes, at, ".entry") => {
                if let Some((name, count, end)) = parse_entry(&text, at + ".entry".len()) {
                    counts.push((name, count));
                    at = end;
                    continue;
                }
            }
            _ => {}
        }
        at += 1;
    }
    counts
}

/// Whether `directive` starts at `at` as a whole token.
fn is_directive(bytes: &[u8], at: usize, directive: &str) -> bool {
    let end = at + directive.len();
    bytes.get(at..end) == Some(directive.as_bytes())
        && (at == 0 || !is_ident(bytes[at - 1]))
        && bytes.get(end).is_none_or(|&b| !is_ident(b))
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%' | b'.')
}

/// Parses `name ( .param ..., .param ... )` after `.entry`; returns the name, the number of
/// parameters and where parsing stopped. An entry with no list has no parameters.
fn parse_entry(text: &str, from: usize) -> Option<(String, usize, usize)> {
    let rest = &text[from..];
    let trimmed = rest.trim_start();
    let name_len = trimmed
        .bytes()
        .take_while(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%'))
        .count();
    if name_len == 0 {
        return None;
    }
    let name = trimmed[..name_len].to_owned();
    let after_name = from + (rest.len() - trimmed.len()) + name_len;
    let tail = &text[after_name..];
    let list = tail.trim_start();
    if !list.starts_with('(') {
        return Some((name, 0, after_name));
    }
    let open = after_name + (tail.len() - list.len());
    let close = open + text[open..].find(')')?;
    let count = text[open + 1..close]
        .split(',')
        .filter(|p| p.split_whitespace().next() == Some(".param"))
        .count();
    Some((name, count, close + 1))
}

/// PTX text with `//` and `/* */` comments blanked out (offsets kept).
fn strip_comments(ptx: &str) -> String {
    let bytes = ptx.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at..].starts_with(b"//") {
            while at < bytes.len() && bytes[at] != b'\n' {
                out.push(b' ');
                at += 1;
            }
        } else if bytes[at..].starts_with(b"/*") {
            let end = ptx[at + 2..]
                .find("*/")
                .map_or(bytes.len(), |e| at + 2 + e + 2);
            out.extend(std::iter::repeat_n(b' ', end - at));
            at = end;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    // Only ASCII bytes were replaced, by ASCII spaces, whole comments at a time.
    String::from_utf8(out).unwrap_or_default()
}

/// `.nv.info` record formats (the first byte of a record).
const EIFMT_SVAL: u8 = 0x04;
/// The record that describes one kernel parameter (ordinal, offset, size).
const EIATTR_KPARAM_INFO: u8 = 0x17;

/// The parameter count of every kernel of a cubin (64-bit little-endian ELF) that has a
/// `.nv.info.<kernel>` section; `None` if the image is not such an ELF or its sections are
/// malformed (the caller then falls back to asking the driver).
pub fn cubin_parameter_counts(image: &[u8]) -> Option<ParameterCounts> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| {
        usize::try_from(u64::from_le_bytes(image.get(at..at + 8)?.try_into().ok()?)).ok()
    };
    if !image.starts_with(b"\x7fELF") || image.get(4) != Some(&2) || image.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(0x28)?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let shstrndx = usize::from(u16_at(0x3e)?);
    if shentsize < 0x40 {
        return None;
    }
    // A section header: its name and the file bytes it spans. Only the sections read here
    // (the name table and `.nv.info.*`) must lie inside the image: others, such as the
    // `SHT_NOBITS` `.nv.shared.*` of every kernel with static shared memory, declare extents
    // that have no bytes in the file.
    let section = |index: usize| -> Option<(u32, usize, usize)> {
        let at = shoff.checked_add(index.checked_mul(shentsize)?)?;
        Some((u32_at(at)?, u64_at(at + 0x18)?, u64_at(at + 0x20)?))
    };
    let bytes = |offset: usize, size: usize| image.get(offset..offset.checked_add(size)?);
    let (_, strtab, strtab_size) = section(shstrndx)?;
    let names = bytes(strtab, strtab_size)?;
    let mut counts = Vec::new();
    for index in 0..shnum {
        let (name, offset, size) = section(index)?;
        let name = names.get(name as usize..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        let Some(kernel) = name.strip_prefix(b".nv.info.") else {
            continue;
        };
        let kernel = std::str::from_utf8(kernel).ok()?.to_owned();
        let records = bytes(offset, size)?;
        let mut count = 0usize;
        let mut at = 0usize;
        while at < records.len() {
            let format = *records.get(at)?;
            let attribute = *records.get(at + 1)?;
            let value = usize::from(u16::from_le_bytes(
                records.get(at + 2..at + 4)?.try_into().ok()?,
            ));
            at += 4;
            if format == EIFMT_SVAL {
                let data = records.get(at..at + value)?;
                if attribute == EIATTR_KPARAM_INFO {
                    // u32 index, u16 ordinal, u16 offset, u32 flags (size in bits 18..32).
                    let ordinal = u16::from_le_bytes(data.get(4..6)?.try_into().ok()?);
                    count = count.max(usize::from(ordinal) + 1);
                }
                at += value;
            }
        }
        counts.push((kernel, count));
    }
    Some(counts)
}

/// The parameter counts an image passed to `load_cubin` gives: a cubin's from its ELF sections,
/// NUL-terminated PTX's from its text; none for a fatbin or anything else.
pub(crate) fn image_parameter_counts(image: &[u8]) -> ParameterCounts {
    if image.starts_with(b"\x7fELF") {
        return cubin_parameter_counts(image).unwrap_or_default();
    }
    const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    if image.starts_with(&FATBIN_MAGIC) {
        return Vec::new();
    }
    let text = image.split(|&b| b == 0).next().unwrap_or_default();
    std::str::from_utf8(text).map_or_else(|_| Vec::new(), ptx_parameter_counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_are_counted_and_comments_and_bodies_ignored() {
        let ptx = "\n.version 7.0\n.target sm_75\n.address_size 64\n\
            // .entry fake(.param .u32 x)\n\
            .visible .entry two( .param .u64 a, /* .param .u32 hidden, */\n .param .align 8 .b8 b[16] )\n\
            { ret; }\n\
            .func (.param .u32 r) helper(.param .u32 x) { ret; }\n\
            .visible .entry none()\n{ ret; }\n\
            .entry bare\n{ ret; }\n";
        assert_eq!(
            ptx_parameter_counts(ptx),
            vec![
                ("two".to_owned(), 2),
                ("none".to_owned(), 0),
                ("bare".to_owned(), 0)
            ]
        );
    }

    #[test]
    fn the_helper_cubins_list_both_helpers_with_their_parameters() {
        // `cuhal_indirect_apply(counts, node, max_x, max_y, max_z, cluster_x, cluster_y,
        // cluster_z, status, index)` in kernels/indirect.cu and
        // `cuhal_bindings_apply(patches, count, done)` in kernels/bindings.cu; the latter has
        // static shared memory, so its cubin carries a `.nv.shared.*` section with no file bytes.
        for (arch, image) in crate::indirect::BUILT_IN {
            let mut counts = cubin_parameter_counts(image).expect("an ELF image");
            counts.sort();
            assert_eq!(
                counts,
                vec![
                    ("cuhal_bindings_apply".to_owned(), 3),
                    ("cuhal_indirect_apply".to_owned(), 10)
                ],
                "sm_{arch}"
            );
            let mut read = image_parameter_counts(image);
            read.sort();
            assert_eq!(read, counts);
        }
    }

    /// A minimal ELF: null section, `.shstrtab`, `.nv.info.k` with the given records, and a
    /// `SHT_NOBITS` `.nv.shared.k` whose extent lies past the end of the file (as static shared
    /// memory's section does in a real cubin).
    fn minimal_elf(info: &[u8]) -> Vec<u8> {
        let strtab = b"\0.shstrtab\0.nv.info.k\0.nv.shared.k\0";
        let mut image = vec![0u8; 0x40];
        image[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let strtab_at = image.len();
        image.extend_from_slice(strtab);
        let info_at = image.len();
        image.extend_from_slice(info);
        let shoff = image.len();
        image[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        image[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        let header = |name: u32, offset: usize, size: usize| {
            let mut h = vec![0u8; 0x40];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(offset as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            h
        };
        image.extend(header(0, 0, 0));
        image.extend(header(1, strtab_at, strtab.len()));
        image.extend(header(11, info_at, info.len()));
        let end = image.len() + 0x40;
        let mut shared = header(22, end, 0x1000);
        shared[4..8].copy_from_slice(&8u32.to_le_bytes()); // SHT_NOBITS
        image.extend(shared);
        image
    }

    fn kparam(ordinal: u16) -> Vec<u8> {
        let mut r = vec![EIFMT_SVAL, EIATTR_KPARAM_INFO, 12, 0, 0, 0, 0, 0];
        r.extend(ordinal.to_le_bytes());
        r.extend([0, 0, 0, 0xf0, 0x11, 0]);
        r
    }

    #[test]
    fn a_hand_built_elf_is_read_exactly() {
        let mut info = vec![0x03, 0x19, 8, 0]; // EIATTR_CBANK_PARAM_SIZE (a value record)
        info.extend(kparam(1));
        info.extend(kparam(0));
        let image = minimal_elf(&info);
        assert_eq!(
            cubin_parameter_counts(&image),
            Some(vec![("k".to_owned(), 2)])
        );
        // No parameter records: no parameters.
        assert_eq!(
            cubin_parameter_counts(&minimal_elf(&[0x03, 0x19, 0, 0])),
            Some(vec![("k".to_owned(), 0)])
        );
        // A record running past its section: malformed, so no counts at all.
        let mut cut = kparam(0);
        cut.truncate(9);
        assert_eq!(cubin_parameter_counts(&minimal_elf(&cut)), None);
        // Not an ELF.
        assert_eq!(cubin_parameter_counts(b"\x7fELF\x01\x01"), None);
    }

    #[test]
    fn nul_terminated_ptx_images_are_read_as_text() {
        let image = b".visible .entry f(.param .u32 a, .param .u32 b)\n{ ret; }\0garbage";
        assert_eq!(image_parameter_counts(image), vec![("f".to_owned(), 2)]);
        assert!(image_parameter_counts(&0xBA55_ED50u32.to_le_bytes()).is_empty());
    }
}
