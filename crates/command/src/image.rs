//! Module images checked against their own headers before the driver reads them.
//!
//! `cuModuleLoadDataEx` takes an image without its length and reads as far as the image's
//! headers say, so every extent a header declares is checked against the slice first.
//!
//! # The fatbin layout
//!
//! A fatbin (`fatbinary.h`, as `nvcc -fatbin` writes it; public parsers such as cuobjdump
//! clones read it the same way) is a container header followed by entries, little-endian:
//!
//! ```text
//! fatBinaryHeader (16 bytes)
//!   0x00 u32 magic        0xBA55ED50 (FATBIN_MAGIC)
//!   0x04 u16 version      1
//!   0x06 u16 headerSize   bytes of this header (16); the first entry starts here
//!   0x08 u64 fatSize      bytes of all entries after the header
//! entry header (64 bytes, longer on recent architectures: its own headerSize says)
//!   0x00 u16 kind         1 PTX, 2 ELF (cubin), 4 old cubin
//!   0x02 u16 version
//!   0x04 u32 headerSize   bytes of this entry header; the payload starts here
//!   0x08 u64 payloadSize  bytes of payload (padded to 8); the next entry starts after it
//!   0x10 u32 compressedSize  bytes of compressed data at the payload's start, if compressed
//!   0x14 u32 (unknown)
//!   0x18 u16 minor, 0x1a u16 major   the PTX ISA or binary version
//!   0x1c u32 arch         the SM architecture, e.g. 90
//!   0x20 u32 obj name offset, 0x24 u32 obj name length
//!   0x28 u64 flags        0x1000 / 0x2000 (0x8000 in some readings): compressed payload
//!   0x30 u64 (zero), 0x38 u64 decompressed size
//! ```
//!
//! Entries follow each other without gaps and fill `fatSize` exactly; there is no terminator.
//! Every entry's header and payload must lie inside the container's declared size (which must
//! lie inside the slice); an uncompressed cubin entry whose payload is an ELF image is checked as
//! a cubin of its own, inside its payload; a compressed entry only for its extent (and its
//! compressed size inside it). A cubin entry that is neither flagged compressed nor an ELF image
//! (a compression this reader does not know) is checked for its extent only: nothing reads it as
//! an ELF without the ELF magic.
//!
//! Several fatbins may follow each other (as in a `.nv_fatbin` section): after a container's
//! declared end, zero padding up to an 8-byte boundary is skipped and, if the next bytes are the
//! fatbin magic again, that container is checked the same way, and so on. Whatever else follows
//! the last container is not fatbin data and is not read as such.

/// ELF identification: magic, 64-bit class, little-endian data.
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// A fatbin's magic number (`FATBIN_MAGIC` in `fatbinary.h`), little-endian.
pub(crate) const FATBIN_MAGIC: u32 = 0xba55_ed50;
/// The size of `fatBinaryHeader`.
const FATBIN_HEADER_BYTES: u64 = 16;
/// The size of the fixed part of a fatbin entry header.
const ENTRY_HEADER_BYTES: u64 = 64;
/// Entry kind of a cubin (ELF) payload (`FATBIN_KIND_ELF`).
pub(crate) const ENTRY_KIND_ELF: u16 = 2;
/// Entry kind of a PTX payload (`FATBIN_KIND_PTX`).
pub(crate) const ENTRY_KIND_PTX: u16 = 1;
/// Entry flags that mark a compressed payload (`FATBIN_FLAG_COMPRESS`, `..._COMPRESS2`, and the
/// bit some readers of zstd-compressed fatbins name).
const ENTRY_FLAGS_COMPRESSED: u64 = 0x1000 | 0x2000 | 0x8000;
/// Section type of a section that occupies no bytes of the file (`.bss`).
const SHT_NOBITS: u64 = 8;

/// Checks that everything a driver reads of a module image lies inside `image`:
///
/// - a cubin (64-bit little-endian ELF): the ELF header, the program and section header tables,
///   and every segment and section they declare;
/// - a fatbin: its header and declared size, and every entry's header (at least 64 bytes) and
///   payload inside that size; an uncompressed cubin entry as a cubin inside its payload, a
///   compressed entry for its extent only; and likewise each further fatbin that follows it
///   (after zero padding to 8 bytes, starting with the fatbin magic);
/// - anything else is taken as PTX text, which the driver reads up to a NUL byte: the slice must
///   contain one.
///
/// Never panics and never reads outside `image`, whatever its bytes.
pub fn check_image(image: &[u8]) -> Result<(), &'static str> {
    if image.starts_with(&ELF_MAGIC) {
        return check_elf(image);
    }
    if u32_at(image, 0) == Some(u64::from(FATBIN_MAGIC)) {
        return check_fatbins(image);
    }
    if !image.contains(&0) {
        return Err("neither an ELF nor a fatbin image, and PTX text without a terminating NUL");
    }
    Ok(())
}

/// One entry of a fatbin, as its header declares it (already checked to lie in its container).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct FatbinEntry<'a> {
    /// The entry's kind ([`ENTRY_KIND_PTX`], [`ENTRY_KIND_ELF`], ...).
    pub(crate) kind: u16,
    /// Whether the payload is compressed.
    pub(crate) compressed: bool,
    /// The payload bytes.
    pub(crate) payload: &'a [u8],
}

/// The entries of every fatbin at the start of `image` (see the module documentation), each
/// checked to lie inside its container; an uncompressed ELF entry also checked as a cubin.
pub(crate) fn fatbin_entries(image: &[u8]) -> Result<Vec<FatbinEntry<'_>>, &'static str> {
    let mut entries = Vec::new();
    let mut at = 0u64;
    loop {
        at = fatbin_container(image, at, &mut entries)?;
        // Zero padding up to the next 8-byte boundary, then maybe another container.
        let padded = at.next_multiple_of(8);
        let padding = image.get(at as usize..(padded as usize).min(image.len()));
        if !padding.is_some_and(|bytes| bytes.iter().all(|&b| b == 0))
            || u32_at(image, padded as usize) != Some(u64::from(FATBIN_MAGIC))
        {
            return Ok(entries);
        }
        at = padded;
    }
}

/// Checks every fatbin of `image`.
fn check_fatbins(image: &[u8]) -> Result<(), &'static str> {
    fatbin_entries(image).map(drop)
}

/// Checks the fatbin container at `base` and adds its entries; returns where it ends.
fn fatbin_container<'a>(
    image: &'a [u8],
    base: u64,
    entries: &mut Vec<FatbinEntry<'a>>,
) -> Result<u64, &'static str> {
    const CUT: &str = "the fatbin header is cut short";
    let len = image.len() as u64;
    let at = |offset: u64| usize::try_from(base + offset).unwrap_or(usize::MAX);
    let header = u16_at(image, at(6)).ok_or(CUT)?;
    let size = u64_at(image, at(8)).ok_or(CUT)?;
    if header < FATBIN_HEADER_BYTES {
        return Err("the fatbin header declares itself shorter than a fatbin header");
    }
    let first = base + header;
    let end = first
        .checked_add(size)
        .filter(|&end| end <= len)
        .ok_or("the fatbin's declared size passes the end of the image")?;
    let mut entry = first;
    while entry < end {
        // Offsets below `end <= len` fit a usize.
        let field = |offset: u64| (entry + offset) as usize;
        if end - entry < ENTRY_HEADER_BYTES {
            return Err("a fatbin entry header passes the fatbin's declared size");
        }
        let kind = u16_at(image, field(0)).ok_or(CUT)? as u16;
        let header = u32_at(image, field(4)).ok_or(CUT)?;
        let payload = u64_at(image, field(8)).ok_or(CUT)?;
        let compressed_size = u32_at(image, field(0x10)).ok_or(CUT)?;
        let flags = u64_at(image, field(0x28)).ok_or(CUT)?;
        if header < ENTRY_HEADER_BYTES {
            return Err("a fatbin entry header declares itself shorter than an entry header");
        }
        if header > end - entry {
            return Err("a fatbin entry header passes the fatbin's declared size");
        }
        let start = entry + header;
        let stop = start
            .checked_add(payload)
            .filter(|&stop| stop <= end)
            .ok_or("a fatbin entry's payload passes the fatbin's declared size")?;
        let bytes = &image[start as usize..stop as usize];
        let compressed = flags & ENTRY_FLAGS_COMPRESSED != 0;
        if compressed {
            if compressed_size > payload {
                return Err("a compressed fatbin entry's data passes its payload");
            }
        } else if kind == ENTRY_KIND_ELF && bytes.starts_with(&ELF_MAGIC) {
            check_elf(bytes)?;
        }
        entries.push(FatbinEntry {
            kind,
            compressed,
            payload: bytes,
        });
        entry = stop;
    }
    Ok(end)
}

/// Checks a 64-bit little-endian ELF image: its header, program and section header tables and
/// every segment and section (but `SHT_NOBITS` ones) inside `image`.
fn check_elf(image: &[u8]) -> Result<(), &'static str> {
    const TRUNCATED: &str = "the ELF header is cut short";
    let len = image.len();
    if image.get(4) != Some(&2) || image.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF image (a cubin)");
    }
    let phoff = u64_at(image, 0x20).ok_or(TRUNCATED)?;
    let shoff = u64_at(image, 0x28).ok_or(TRUNCATED)?;
    let ehsize = u16_at(image, 0x34).ok_or(TRUNCATED)?;
    let phentsize = u16_at(image, 0x36).ok_or(TRUNCATED)?;
    let phnum = u16_at(image, 0x38).ok_or(TRUNCATED)?;
    let shentsize = u16_at(image, 0x3a).ok_or(TRUNCATED)?;
    let shnum = u16_at(image, 0x3c).ok_or(TRUNCATED)?;
    if !inside(len, 0, 1, ehsize.max(64)) {
        return Err(TRUNCATED);
    }
    if phnum > 0 && (phentsize < 0x38 || !inside(len, phoff, phnum, phentsize)) {
        return Err("the ELF program headers lie past the end of the image");
    }
    if shnum > 0 && (shentsize < 0x40 || !inside(len, shoff, shnum, shentsize)) {
        return Err("the ELF section headers lie past the end of the image");
    }
    // The tables lie inside `image`, so these offsets fit a usize.
    for i in 0..phnum {
        let at = (phoff + i * phentsize) as usize;
        let offset = u64_at(image, at + 0x08).ok_or(TRUNCATED)?;
        let size = u64_at(image, at + 0x20).ok_or(TRUNCATED)?;
        if !inside(len, offset, 1, size) {
            return Err("an ELF segment lies past the end of the image");
        }
    }
    for i in 0..shnum {
        let at = (shoff + i * shentsize) as usize;
        let kind = u32_at(image, at + 0x04).ok_or(TRUNCATED)?;
        let offset = u64_at(image, at + 0x18).ok_or(TRUNCATED)?;
        let size = u64_at(image, at + 0x20).ok_or(TRUNCATED)?;
        if kind != SHT_NOBITS && !inside(len, offset, 1, size) {
            return Err("an ELF section lies past the end of the image");
        }
    }
    Ok(())
}

fn u16_at(image: &[u8], at: usize) -> Option<u64> {
    let bytes = image.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes(bytes.try_into().ok()?).into())
}

fn u32_at(image: &[u8], at: usize) -> Option<u64> {
    let bytes = image.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?).into())
}

fn u64_at(image: &[u8], at: usize) -> Option<u64> {
    let bytes = image.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// `offset + count * size <= len`, without overflow.
fn inside(len: usize, offset: u64, count: u64, size: u64) -> bool {
    count
        .checked_mul(size)
        .and_then(|bytes| bytes.checked_add(offset))
        .is_some_and(|end| end <= len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_checked_against_their_declared_extent() {
        // A minimal 64-bit ELF header with one section header table entry right after it.
        let mut elf = vec![0u8; 64 + 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        elf[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(check_image(&elf), Ok(()));
        // The section claims bytes past the end.
        let mut far = elf.clone();
        far[64 + 0x18..64 + 0x20].copy_from_slice(&100u64.to_le_bytes());
        far[64 + 0x20..64 + 0x28].copy_from_slice(&100u64.to_le_bytes());
        assert!(check_image(&far).is_err());
        // ... unless it occupies no file bytes.
        far[64 + 4..64 + 8].copy_from_slice(&8u32.to_le_bytes());
        assert_eq!(check_image(&far), Ok(()));
        // The header table itself is cut off; offsets that overflow.
        assert!(check_image(&elf[..100]).is_err());
        let mut wrap = elf.clone();
        wrap[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check_image(&wrap).is_err());
        assert!(check_image(&elf[..20]).is_err());
        // An empty fatbin, then one declaring more than the slice holds.
        let mut fat = vec![0u8; 16];
        fat[..4].copy_from_slice(&0xba55_ed50u32.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        assert_eq!(check_image(&fat), Ok(()));
        fat[8..16].copy_from_slice(&1u64.to_le_bytes());
        assert!(check_image(&fat).is_err());
        assert_eq!(check_image(b".version 8.0\0"), Ok(()));
        assert!(check_image(b".version 8.0").is_err());
        assert!(check_image(b"").is_err());
    }

    /// A fatbin of one entry of `kind` with `payload`, padded to 8 bytes.
    fn fatbin(kind: u16, flags: u64, payload: &[u8]) -> Vec<u8> {
        let padded = payload.len().next_multiple_of(8);
        let mut image = vec![0u8; 16 + 64 + padded];
        image[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image[4..6].copy_from_slice(&1u16.to_le_bytes());
        image[6..8].copy_from_slice(&16u16.to_le_bytes());
        image[8..16].copy_from_slice(&((64 + padded) as u64).to_le_bytes());
        image[16..18].copy_from_slice(&kind.to_le_bytes());
        image[20..24].copy_from_slice(&64u32.to_le_bytes());
        image[24..32].copy_from_slice(&(padded as u64).to_le_bytes());
        image[32..36].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        image[16 + 0x28..16 + 0x30].copy_from_slice(&flags.to_le_bytes());
        image[80..80 + payload.len()].copy_from_slice(payload);
        image
    }

    #[test]
    fn fatbin_entries_are_walked_and_an_uncompressed_cubin_checked_inside_its_payload() {
        let ptx = fatbin(ENTRY_KIND_PTX, 0, b".entry k() { ret; }\0");
        assert_eq!(check_image(&ptx), Ok(()));
        let entries = fatbin_entries(&ptx).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].kind, ENTRY_KIND_PTX);
        assert!(entries[0].payload.starts_with(b".entry k()"));

        // The regression: the container's size fits the slice, but the entry's payload size
        // runs past it (into bytes the slice happens to hold, then beyond).
        let mut past = ptx.clone();
        past[24..32].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(
            check_image(&past),
            Err("a fatbin entry's payload passes the fatbin's declared size")
        );
        past.resize(4096, 0);
        assert!(check_image(&past).is_err(), "even with the bytes there");

        // An ELF entry whose section headers lie past its payload (inside the container's
        // later bytes would not do either).
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(
            check_image(&fatbin(ENTRY_KIND_ELF, 0, &elf)),
            Err("the ELF section headers lie past the end of the image")
        );
        // Compressed, it is checked only for its extent.
        assert_eq!(check_image(&fatbin(ENTRY_KIND_ELF, 0x2000, &elf)), Ok(()));
        // A cubin entry that is no ELF (compressed in a way the flags do not say): its extent.
        assert_eq!(
            check_image(&fatbin(ENTRY_KIND_ELF, 0, b"\x28\xb5\x2f\xfd...")),
            Ok(())
        );
    }
}
