//! What a module image says of each kernel's parameters: how many, and their sizes where it
//! gives them.
//!
//! `cuFuncGetParamInfo` reports one parameter's offset and size but not how many there are; only
//! CUDA 13.0 drivers export `cuFuncGetParamCount`. Without it the count used to be found by
//! probing past the last index until the driver answered `CUDA_ERROR_INVALID_VALUE`: one failing
//! call per kernel, which compute-sanitizer reports as an API error. The image the module was
//! loaded from says how many parameters each entry has, exactly, so the count comes from there.
//! Where the driver cannot report parameters at all (before CUDA 12.4), the same reading is what a
//! layout the caller states is checked against (`Function::with_parameter_sizes`):
//!
//! - PTX: the parameter list of each `.entry` (comments skipped); a parameter's size is its type's
//!   (`.u32` 4 bytes, `.b8 x[16]` 16 bytes, ...), unknown for a type this reader does not know.
//! - cubin (ELF): the `EIATTR_KPARAM_INFO` records of each `.nv.info.<kernel>` section, one per
//!   parameter, each with the parameter's ordinal and size; a kernel section with none has no
//!   parameters, unless its `EIATTR_CBANK_PARAM_SIZE` / `EIATTR_PARAM_CBANK` says it has
//!   parameter bytes (then the image does not say).
//! - fatbin: what its entries say, where every entry is an uncompressed PTX or cubin entry and
//!   they agree on a kernel; a fatbin with a compressed entry says nothing (the driver may load
//!   the entry this reader cannot see).
//!
//! Anything else gives nothing, and then the driver is probed as before.

/// What a module image says of one kernel's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageParameters {
    /// How many parameters the kernel takes.
    pub(crate) count: usize,
    /// Each parameter's size in bytes, in order, where the image gives every one of them.
    pub(crate) sizes: Option<Vec<usize>>,
}

/// Each kernel's name and what the image says of its parameters.
pub(crate) type ParameterLayouts = Vec<(String, ImageParameters)>;

/// A kernel's name and how many parameters it takes, as read from its module image.
pub type ParameterCounts = Vec<(String, usize)>;

/// The parameter count of every `.entry` in PTX text. Entries are found at the top level (outside
/// every `{ }` body), so a kernel body cannot fake one.
pub fn ptx_parameter_counts(ptx: &str) -> ParameterCounts {
    counts(ptx_parameter_layouts(ptx))
}

/// Each kernel's parameter count, from its layout.
fn counts(layouts: ParameterLayouts) -> ParameterCounts {
    layouts
        .into_iter()
        .map(|(name, layout)| (name, layout.count))
        .collect()
}

/// The parameters of every `.entry` in PTX text (see [`ptx_parameter_counts`]).
pub(crate) fn ptx_parameter_layouts(ptx: &str) -> ParameterLayouts {
    let text = strip_comments(ptx);
    let bytes = text.as_bytes();
    let mut layouts = Vec::new();
    let mut depth = 0usize;
    let mut at = 0usize;
    while at < bytes.len() {
        match bytes[at] {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b'.' if depth == 0 && is_directive(bytes, at, ".entry") => {
                if let Some((name, layout, end)) = parse_entry(&text, at + ".entry".len()) {
                    layouts.push((name, layout));
                    at = end;
                    continue;
                }
            }
            _ => {}
        }
        at += 1;
    }
    layouts
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

/// Parses `name ( .param ..., .param ... )` after `.entry`; returns the name, its parameters and
/// where parsing stopped. An entry with no list has no parameters.
fn parse_entry(text: &str, from: usize) -> Option<(String, ImageParameters, usize)> {
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
        let none = ImageParameters {
            count: 0,
            sizes: Some(Vec::new()),
        };
        return Some((name, none, after_name));
    }
    let open = after_name + (tail.len() - list.len());
    let close = open + text[open..].find(')')?;
    let params: Vec<&str> = text[open + 1..close]
        .split(',')
        .filter(|p| p.split_whitespace().next() == Some(".param"))
        .collect();
    let layout = ImageParameters {
        count: params.len(),
        sizes: params.iter().map(|p| ptx_parameter_size(p)).collect(),
    };
    Some((name, layout, close + 1))
}

/// The size in bytes of one `.param` declaration: its type's size times the element count of
/// its `[N]` dimensions (`.param .align 8 .b8 s[24]` is 24 bytes); `None` for a type this
/// reader does not know (`.texref` and the like) or a dimension it cannot read.
fn ptx_parameter_size(declaration: &str) -> Option<usize> {
    let element: usize = declaration.split_whitespace().find_map(|word| {
        Some(match word {
            ".b8" | ".u8" | ".s8" => 1,
            ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
            ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
            ".b64" | ".u64" | ".s64" | ".f64" => 8,
            ".b128" => 16,
            _ => return None,
        })
    })?;
    let mut elements = 1usize;
    let mut rest = declaration;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']')?;
        elements = elements.checked_mul(rest[open + 1..close].trim().parse().ok()?)?;
        rest = &rest[close + 1..];
    }
    element.checked_mul(elements)
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

/// `.nv.info` record formats (the first byte of a record): a 16-bit value in the record header.
const EIFMT_HVAL: u8 = 0x03;
/// A record with a 16-bit length and that many bytes of value after the header.
const EIFMT_SVAL: u8 = 0x04;
/// The record that describes one kernel parameter: u32 index, u16 ordinal, u16 offset, u32 with
/// the size in bytes in bits 18..32 (log alignment, space and constant bank below).
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// The record of the parameter constant bank: u32 symbol, u16 offset, u16 size in bytes.
const EIATTR_PARAM_CBANK: u8 = 0x0a;
/// The record of the parameters' total size in bytes (an `EIFMT_HVAL`).
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;

/// The parameter count of every kernel of a cubin (64-bit little-endian ELF) that has a
/// `.nv.info.<kernel>` section; `None` if the image is not such an ELF or its sections are
/// malformed (the caller then falls back to asking the driver).
pub fn cubin_parameter_counts(image: &[u8]) -> Option<ParameterCounts> {
    cubin_parameter_layouts(image).map(counts)
}

/// The parameters of every kernel of a cubin whose `.nv.info.<kernel>` section says what they
/// are (see [`cubin_parameter_counts`]).
pub(crate) fn cubin_parameter_layouts(image: &[u8]) -> Option<ParameterLayouts> {
    // Every offset is checked: a header may name any of them.
    let field = |at: usize, len: usize| image.get(at..at.checked_add(len)?);
    let u16_at = |at: usize| Some(u16::from_le_bytes(field(at, 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(field(at, 4)?.try_into().ok()?));
    let u64_at =
        |at: usize| usize::try_from(u64::from_le_bytes(field(at, 8)?.try_into().ok()?)).ok();
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
        Some((
            u32_at(at)?,
            u64_at(at.checked_add(0x18)?)?,
            u64_at(at.checked_add(0x20)?)?,
        ))
    };
    let bytes = |offset: usize, size: usize| image.get(offset..offset.checked_add(size)?);
    let (_, strtab, strtab_size) = section(shstrndx)?;
    let names = bytes(strtab, strtab_size)?;
    let mut layouts = Vec::new();
    for index in 0..shnum {
        let (name, offset, size) = section(index)?;
        let name = names.get(name as usize..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        let Some(kernel) = name.strip_prefix(b".nv.info.") else {
            continue;
        };
        let kernel = std::str::from_utf8(kernel).ok()?.to_owned();
        let records = bytes(offset, size)?;
        // (ordinal, size) of each parameter record; the parameter bytes the kernel declares.
        let mut params: Vec<(usize, usize)> = Vec::new();
        let mut bank_bytes = 0usize;
        let mut at = 0usize;
        while at < records.len() {
            let format = *records.get(at)?;
            let attribute = *records.get(at + 1)?;
            let value = usize::from(u16::from_le_bytes(
                records.get(at + 2..at + 4)?.try_into().ok()?,
            ));
            at += 4;
            if format == EIFMT_HVAL && attribute == EIATTR_CBANK_PARAM_SIZE {
                bank_bytes = bank_bytes.max(value);
            }
            if format == EIFMT_SVAL {
                let data = records.get(at..at + value)?;
                let u16_of =
                    |at: usize| Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?));
                if attribute == EIATTR_KPARAM_INFO {
                    let ordinal = usize::from(u16_of(4)?);
                    let flags = u32::from_le_bytes(data.get(8..12)?.try_into().ok()?);
                    params.push((ordinal, (flags >> 18) as usize));
                }
                if attribute == EIATTR_PARAM_CBANK {
                    bank_bytes = bank_bytes.max(usize::from(u16_of(6)?));
                }
                at += value;
            }
        }
        if params.is_empty() && bank_bytes > 0 {
            // Parameter bytes but no record of them: the image does not say.
            continue;
        }
        let count = params
            .iter()
            .map(|&(ordinal, _)| ordinal + 1)
            .max()
            .unwrap_or(0);
        // Sizes where every ordinal has exactly one record.
        let mut sizes = vec![None; count];
        let mut once = true;
        for &(ordinal, size) in &params {
            once &= sizes[ordinal].replace(size).is_none();
        }
        let sizes = sizes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .filter(|_| once);
        layouts.push((kernel, ImageParameters { count, sizes }));
    }
    Some(layouts)
}

/// What an image passed to `load_cubin` says of its kernels' parameters: a cubin's ELF sections,
/// NUL-terminated PTX's text, a fatbin's entries where it holds only uncompressed PTX and cubin
/// entries (and they agree); nothing for anything else.
pub(crate) fn image_parameter_layouts(image: &[u8]) -> ParameterLayouts {
    if image.starts_with(b"\x7fELF") {
        return cubin_parameter_layouts(image).unwrap_or_default();
    }
    if image.starts_with(&crate::image::FATBIN_MAGIC.to_le_bytes()) {
        return fatbin_parameter_layouts(image).unwrap_or_default();
    }
    ptx_image_layouts(image)
}

/// The layouts of NUL-terminated PTX text (up to its first NUL).
fn ptx_image_layouts(image: &[u8]) -> ParameterLayouts {
    let text = image.split(|&b| b == 0).next().unwrap_or_default();
    std::str::from_utf8(text).map_or_else(|_| Vec::new(), ptx_parameter_layouts)
}

/// The layouts every entry of a fatbin agrees on; `None` if it has an entry this reader cannot
/// read (compressed, another kind, malformed).
fn fatbin_parameter_layouts(image: &[u8]) -> Option<ParameterLayouts> {
    use crate::image::{ENTRY_KIND_ELF, ENTRY_KIND_PTX};
    let mut merged: Vec<(String, Option<ImageParameters>)> = Vec::new();
    for entry in crate::image::fatbin_entries(image).ok()? {
        let layouts = match (entry.kind, entry.compressed) {
            (ENTRY_KIND_ELF, false) => cubin_parameter_layouts(entry.payload)?,
            (ENTRY_KIND_PTX, false) => {
                // Text the reader cannot take (compressed in a way the flags do not say): the
                // driver may read it, this reader cannot.
                let text = entry.payload.split(|&b| b == 0).next().unwrap_or_default();
                ptx_parameter_layouts(std::str::from_utf8(text).ok()?)
            }
            _ => return None,
        };
        for (name, layout) in layouts {
            match merged.iter_mut().find(|(known, _)| *known == name) {
                // Entries that disagree on a kernel: it is not known.
                Some((_, seen)) if seen.as_ref() != Some(&layout) => *seen = None,
                Some(_) => {}
                None => merged.push((name, Some(layout))),
            }
        }
    }
    Some(
        merged
            .into_iter()
            .filter_map(|(name, layout)| Some((name, layout?)))
            .collect(),
    )
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
            let mut expected = cubin_parameter_counts(image).expect("an ELF image");
            expected.sort();
            assert_eq!(
                expected,
                vec![
                    ("cuhal_bindings_apply".to_owned(), 3),
                    ("cuhal_indirect_apply".to_owned(), 10)
                ],
                "sm_{arch}"
            );
            let mut read = counts(image_parameter_layouts(image));
            read.sort();
            assert_eq!(read, expected);
            // And the sizes of their `EIATTR_KPARAM_INFO` records: pointers 8 bytes, `unsigned
            // int`s 4, the graph node handle 8.
            let mut layouts = cubin_parameter_layouts(image).unwrap();
            layouts.sort_by(|a, b| a.0.cmp(&b.0));
            let sizes: Vec<_> = layouts.into_iter().map(|(_, l)| l.sizes).collect();
            assert_eq!(
                sizes,
                [
                    Some(vec![8, 4, 8]),
                    Some(vec![8, 8, 4, 4, 4, 4, 4, 4, 8, 4])
                ],
                "sm_{arch}"
            );
        }
    }

    /// A minimal ELF: null section, `.shstrtab`, `.nv.info.k` with the given records, and a
    /// `SHT_NOBITS` `.nv.shared.k` whose extent lies past the end of the file (as static shared
    /// memory's section does in a real cubin).
    fn minimal_elf(info: &[u8]) -> Vec<u8> {
        crate::testing::ElfImage::new()
            .section(".nv.info.k", info)
            .no_bits(".nv.shared.k", 0x1000)
            .build()
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
        // A section table declared at the very end of the address space: no counts, and no
        // overflow on the way (an ELF entry of a fatbin is read whatever its header says).
        let mut far = minimal_elf(&info);
        let header = |at: usize| u64::from(u16::from_le_bytes([far[at], far[at + 1]]));
        // The name table's header then starts 2 bytes before the end: its fields run past it.
        let table = header(0x3e) * header(0x3a);
        far[0x28..0x30].copy_from_slice(&(u64::MAX - 1 - table).to_le_bytes());
        assert_eq!(cubin_parameter_counts(&far), None);
    }

    #[test]
    fn nul_terminated_ptx_images_are_read_as_text() {
        let image = b".visible .entry f(.param .u32 a, .param .u32 b)\n{ ret; }\0garbage";
        assert_eq!(
            counts(image_parameter_layouts(image)),
            vec![("f".to_owned(), 2)]
        );
        assert!(image_parameter_layouts(&0xBA55_ED50u32.to_le_bytes()).is_empty());
    }

    fn layout(count: usize, sizes: Option<Vec<usize>>) -> ImageParameters {
        ImageParameters { count, sizes }
    }

    #[test]
    fn ptx_parameter_sizes_come_from_their_types() {
        let ptx = ".visible .entry k(.param .u64 .ptr.global.align 16 p, .param .f32 x,\n\
            .param .align 8 .b8 s[24], .param .u16 h, .param .b8 m[2][3])\n{ ret; }\n\
            .entry t(.param .u32 a, .param .texref tex)\n{ ret; }\n\
            .entry none()\n{ ret; }\n";
        assert_eq!(
            ptx_parameter_layouts(ptx),
            vec![
                ("k".to_owned(), layout(5, Some(vec![8, 4, 24, 2, 6]))),
                // A type this reader does not size: the count alone.
                ("t".to_owned(), layout(2, None)),
                ("none".to_owned(), layout(0, Some(vec![]))),
            ]
        );
    }

    /// A `EIATTR_KPARAM_INFO` record of the parameter `ordinal`, `size` bytes.
    fn kparam_of(ordinal: u16, size: u32) -> Vec<u8> {
        let mut r = vec![EIFMT_SVAL, EIATTR_KPARAM_INFO, 12, 0, 0, 0, 0, 0];
        r.extend(ordinal.to_le_bytes());
        r.extend([0, 0]);
        r.extend((size << 18 | 0x1f << 12).to_le_bytes());
        r
    }

    #[test]
    fn cubin_parameter_sizes_come_from_their_records() {
        let records = [kparam_of(1, 4), kparam_of(0, 8), kparam_of(2, 16)].concat();
        assert_eq!(
            cubin_parameter_layouts(&minimal_elf(&records)),
            Some(vec![("k".to_owned(), layout(3, Some(vec![8, 4, 16])))])
        );
        // Two records of one ordinal, or a missing one: the count, not the sizes.
        let twice = [kparam_of(0, 8), kparam_of(0, 4)].concat();
        assert_eq!(
            cubin_parameter_layouts(&minimal_elf(&twice)),
            Some(vec![("k".to_owned(), layout(1, None))])
        );
        let gap = [kparam_of(0, 8), kparam_of(2, 4)].concat();
        assert_eq!(
            cubin_parameter_layouts(&minimal_elf(&gap)),
            Some(vec![("k".to_owned(), layout(3, None))])
        );
        // Parameter bytes (EIATTR_CBANK_PARAM_SIZE, EIATTR_PARAM_CBANK) but no records: the image
        // does not say, rather than "no parameters".
        for bank in [
            vec![EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, 8, 0],
            vec![EIFMT_SVAL, EIATTR_PARAM_CBANK, 8, 0, 0, 0, 0, 0, 0, 0, 8, 0],
        ] {
            assert_eq!(cubin_parameter_layouts(&minimal_elf(&bank)), Some(vec![]));
        }
    }

    /// A fatbin of uncompressed (or, with `compressed`, compressed) entries of these kinds and
    /// payloads.
    fn fatbin(entries: &[(u16, &[u8])], compressed: bool) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, payload) in entries {
            let padded = payload.len().next_multiple_of(8);
            let mut header = vec![0u8; 64];
            header[0..2].copy_from_slice(&kind.to_le_bytes());
            header[4..8].copy_from_slice(&64u32.to_le_bytes());
            header[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
            header[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            let flags: u64 = if compressed { 0x2000 } else { 0 };
            header[0x28..0x30].copy_from_slice(&flags.to_le_bytes());
            body.extend(header);
            body.extend(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut image = vec![0u8; 16];
        image[..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
        image[4..6].copy_from_slice(&1u16.to_le_bytes());
        image[6..8].copy_from_slice(&16u16.to_le_bytes());
        image[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        image.extend(body);
        image
    }

    #[test]
    fn a_fatbins_uncompressed_entries_say_what_they_agree_on() {
        use crate::image::{ENTRY_KIND_ELF, ENTRY_KIND_PTX};
        let elf = minimal_elf(&[kparam_of(0, 8), kparam_of(1, 4)].concat());
        let ptx = b".entry k(.param .u64 a, .param .u32 b) { ret; }\n.entry j() { ret; }\0";
        let both = fatbin(&[(ENTRY_KIND_ELF, &elf), (ENTRY_KIND_PTX, ptx)], false);
        assert_eq!(crate::image::check_image(&both), Ok(()));
        assert_eq!(
            image_parameter_layouts(&both),
            vec![
                ("k".to_owned(), layout(2, Some(vec![8, 4]))),
                ("j".to_owned(), layout(0, Some(vec![]))),
            ]
        );
        // Entries that disagree on `k`: it is not known.
        let other = b".entry k(.param .u64 a) { ret; }\0";
        let disagree = fatbin(&[(ENTRY_KIND_ELF, &elf), (ENTRY_KIND_PTX, other)], false);
        assert_eq!(image_parameter_layouts(&disagree), vec![]);
        // A compressed entry could be the one the driver loads: nothing is known.
        let compressed = fatbin(&[(ENTRY_KIND_PTX, ptx)], true);
        assert_eq!(crate::image::check_image(&compressed), Ok(()));
        assert_eq!(image_parameter_layouts(&compressed), vec![]);
    }
}
