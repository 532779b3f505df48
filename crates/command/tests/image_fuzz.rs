//! `check_image` against fatbins built from scratch, then cut short at every length and mutated
//! (deterministically): it must accept the whole images, never panic, and refuse every image
//! whose entries pass their fatbin's declared size or whose cubin entries' header tables pass
//! their payload.

use cuhal_command::check_image;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

const FATBIN_MAGIC: u32 = 0xba55_ed50;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const COMPRESSED: u64 = 0x2000;

/// A minimal cubin: ELF header, 32 bytes of data, one program header over the data, and three
/// section headers (null, the data, a `.bss`-like `SHT_NOBITS` one whose extent is not in the
/// file).
fn elf() -> Vec<u8> {
    let mut image = vec![0u8; 64];
    image[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    image.extend([0xab; 32]);
    let phoff = image.len();
    let mut phdr = vec![0u8; 56];
    phdr[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    phdr[8..16].copy_from_slice(&64u64.to_le_bytes());
    phdr[32..40].copy_from_slice(&32u64.to_le_bytes());
    image.extend(phdr);
    let shoff = image.len();
    let section = |kind: u32, offset: u64, size: u64| {
        let mut h = vec![0u8; 64];
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&size.to_le_bytes());
        h
    };
    image.extend(section(0, 0, 0));
    image.extend(section(1, 64, 32));
    image.extend(section(8, 0x10_0000, 0x1000));
    image[0x20..0x28].copy_from_slice(&(phoff as u64).to_le_bytes());
    image[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    image[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    image[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    image[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    image[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    image
}

/// One fatbin entry: its kind, flags, header length (64, or longer as recent architectures
/// write) and payload (padded to 8 bytes in the image).
struct Entry {
    kind: u16,
    flags: u64,
    header: usize,
    payload: Vec<u8>,
}

impl Entry {
    fn ptx(text: &str) -> Self {
        let mut payload = text.as_bytes().to_vec();
        payload.push(0);
        Entry {
            kind: KIND_PTX,
            flags: 0,
            header: 64,
            payload,
        }
    }

    fn elf(header: usize) -> Self {
        Entry {
            kind: KIND_ELF,
            flags: 0,
            header,
            payload: elf(),
        }
    }

    fn compressed(kind: u16, bytes: usize) -> Self {
        Entry {
            kind,
            flags: COMPRESSED,
            header: 64,
            payload: (0..bytes).map(|i| (i * 7) as u8).collect(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let padded = self.payload.len().next_multiple_of(8);
        let mut out = vec![0u8; self.header + padded];
        out[0..2].copy_from_slice(&self.kind.to_le_bytes());
        out[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        out[4..8].copy_from_slice(&(self.header as u32).to_le_bytes());
        out[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
        out[16..20].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        out[0x1c..0x20].copy_from_slice(&90u32.to_le_bytes());
        out[0x28..0x30].copy_from_slice(&self.flags.to_le_bytes());
        out[0x38..0x40].copy_from_slice(&(self.payload.len() as u64 * 3).to_le_bytes());
        out[self.header..self.header + self.payload.len()].copy_from_slice(&self.payload);
        out
    }
}

/// A fatbin container of `entries`.
fn fatbin(entries: &[Entry]) -> Vec<u8> {
    let body: Vec<u8> = entries.iter().flat_map(Entry::bytes).collect();
    let mut image = vec![0u8; 16];
    image[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
    image[4..6].copy_from_slice(&1u16.to_le_bytes());
    image[6..8].copy_from_slice(&16u16.to_le_bytes());
    image[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
    image.extend(body);
    image
}

/// The valid images the tests start from, each with the offsets where its containers start.
fn valid_images() -> Vec<(Vec<u8>, Vec<usize>)> {
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
               .visible .entry k(.param .u64 a, .param .u32 b) { ret; }";
    let singles = [
        fatbin(&[Entry::ptx(ptx)]),
        fatbin(&[Entry::elf(64)]),
        fatbin(&[Entry::elf(112), Entry::ptx(ptx), Entry::elf(64)]),
        fatbin(&[
            Entry::compressed(KIND_ELF, 45),
            Entry::ptx("x"),
            Entry::compressed(KIND_PTX, 8),
        ]),
        fatbin(&[]),
    ];
    let mut images: Vec<(Vec<u8>, Vec<usize>)> = singles
        .iter()
        .map(|image| (image.clone(), vec![0]))
        .collect();
    // Several containers back to back, as in a `.nv_fatbin` section.
    let mut several = Vec::new();
    let mut starts = Vec::new();
    for image in [&singles[0], &singles[2], &singles[1]] {
        starts.push(several.len());
        several.extend_from_slice(image);
    }
    images.push((several, starts));
    images
}

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?).into())
}
fn u32_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?).into())
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Whether an uncompressed ELF payload's own header tables pass the end of the payload.
fn elf_tables_escape(elf: &[u8]) -> bool {
    let len = elf.len() as u128;
    let field = |read: fn(&[u8], usize) -> Option<u64>, at| read(elf, at).map(u128::from);
    let (Some(phoff), Some(shoff), Some(phsize), Some(phnum), Some(shsize), Some(shnum)) = (
        field(u64_at, 0x20),
        field(u64_at, 0x28),
        field(u16_at, 0x36),
        field(u16_at, 0x38),
        field(u16_at, 0x3a),
        field(u16_at, 0x3c),
    ) else {
        return true;
    };
    (phnum > 0 && phoff + phnum * phsize > len) || (shnum > 0 && shoff + shnum * shsize > len)
}

/// An independent, minimal reading of the layout: whether any fatbin of `image` declares more
/// than the slice holds, or any of its entries (header or payload) passes its fatbin's declared
/// size, or an uncompressed cubin entry's header tables pass its payload.
fn escapes(image: &[u8]) -> bool {
    if u32_at(image, 0) != Some(u64::from(FATBIN_MAGIC)) {
        // Not a fatbin (a mutated magic): nothing of it is read as one.
        return false;
    }
    let len = image.len() as u128;
    let mut base = 0usize;
    loop {
        let (Some(header), Some(size)) = (u16_at(image, base + 6), u64_at(image, base + 8)) else {
            return true;
        };
        if header < 16 {
            // Not a fatbin header `check_image` reads further (it refuses it).
            return false;
        }
        let end = base as u128 + u128::from(header) + u128::from(size);
        if end > len {
            return true;
        }
        let end = end as usize;
        let mut entry = base + header as usize;
        while entry < end {
            if entry + 16 > end {
                return true;
            }
            let header = u32_at(image, entry + 4).unwrap() as usize;
            let payload = u64_at(image, entry + 8).unwrap() as u128;
            if (entry + header) as u128 + payload > end as u128 {
                return true;
            }
            let start = entry + header;
            let stop = start + payload as usize;
            let kind = u16_at(image, entry).unwrap() as u16;
            let flags = u64_at(image, entry + 0x28);
            if kind == KIND_ELF
                && flags.is_some_and(|f| f & 0xb000 == 0)
                && image[start..stop].starts_with(b"\x7fELF")
                && elf_tables_escape(&image[start..stop])
            {
                return true;
            }
            if header == 0 && payload == 0 {
                // No progress: `check_image` refuses it for its short header anyway.
                return false;
            }
            entry = stop;
        }
        let next = end.next_multiple_of(8);
        if !image[end..next.min(image.len())].iter().all(|&b| b == 0)
            || u32_at(image, next) != Some(u64::from(FATBIN_MAGIC))
        {
            return false;
        }
        base = next;
    }
}

#[test]
fn built_fatbins_pass() {
    for (image, _) in valid_images() {
        assert_eq!(check_image(&image), Ok(()), "{} bytes", image.len());
        assert!(!escapes(&image));
    }
}

/// Every prefix of a valid image is refused, but where it ends on a container's end (the
/// fatbins before it are whole) or cuts the next container's magic (which then does not read
/// as a fatbin). The prefix is a slice of the whole image, so reading past it would see valid
/// bytes; it must not matter.
#[test]
fn fatbins_cut_short_at_every_length_are_refused() {
    let mut cases = 0;
    for (image, starts) in valid_images() {
        for cut in 0..image.len() {
            let result = check_image(&image[..cut]);
            let at_boundary = starts
                .iter()
                .skip(1)
                .any(|&start| (start..start + 4).contains(&cut));
            assert_eq!(
                result.is_ok(),
                at_boundary,
                "cut at {cut} of {}: {result:?}",
                image.len()
            );
            cases += 1;
        }
    }
    assert!(cases > 2000, "{cases} cases");
}

/// An entry's payload size raised by one past what its fatbin's declared size leaves it, for
/// every entry of every image: refused. The old check (only the container's size against the
/// slice) let all of these through.
#[test]
fn every_entry_whose_payload_passes_the_declared_size_is_refused() {
    for (image, starts) in valid_images() {
        for &base in &starts {
            let end = base + 16 + u64_at(&image, base + 8).unwrap() as usize;
            let mut entry = base + 16;
            while entry < end {
                let header = u32_at(&image, entry + 4).unwrap() as usize;
                let payload = u64_at(&image, entry + 8).unwrap() as usize;
                let mut bad = image.clone();
                let past = (end - entry - header + 1) as u64;
                bad[entry + 8..entry + 16].copy_from_slice(&past.to_le_bytes());
                assert!(escapes(&bad));
                assert!(
                    check_image(&bad).is_err(),
                    "entry at {entry} of the container at {base}"
                );
                entry += header + payload;
            }
        }
    }
}

/// A byte or field of a valid image overwritten, a few times over.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR one byte.
    Flip { at: usize, mask: u8 },
    /// Write a little-endian value of `width` bytes (2, 4 or 8).
    Field { at: usize, width: usize, value: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let value = prop_oneof![
        Just(0u64),
        Just(1),
        Just(16),
        Just(63),
        Just(64),
        Just(65),
        Just(0x7fff_ffff),
        Just(u32::MAX as u64),
        Just(u64::MAX),
        Just(u64::MAX - 15),
        0u64..2048,
        any::<u64>(),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (
            any::<usize>(),
            prop_oneof![Just(2), Just(4), Just(8)],
            value
        )
            .prop_map(|(at, width, value)| Mutation::Field { at, width, value }),
    ]
}

fn apply(image: &mut [u8], mutation: &Mutation) {
    match *mutation {
        Mutation::Flip { at, mask } => {
            let at = at % image.len();
            image[at] ^= mask;
        }
        Mutation::Field { at, width, value } => {
            if image.len() < width {
                return;
            }
            let at = at % (image.len() - width + 1);
            image[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
    }
}

/// Deterministic pseudo-random mutations (fixed seed, so every run checks the same cases):
/// `check_image` never panics, and refuses every mutated image whose entries escape.
#[test]
fn mutated_fatbins_never_panic_and_escaping_entries_are_refused() {
    let images = valid_images();
    let config = Config {
        cases: 20_000,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (
        0..images.len(),
        proptest::collection::vec(mutation(), 1..4),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(index, mutations, cut)| {
            let mut image = images[index].0.clone();
            for mutation in &mutations {
                apply(&mut image, mutation);
            }
            // Half the cases also lose their last byte.
            let image = if cut {
                &image[..image.len() - 1]
            } else {
                &image[..]
            };
            let result = check_image(image);
            if escapes(image) {
                prop_assert!(result.is_err(), "accepted an escaping image: {mutations:?}");
            }
            Ok(())
        })
        .unwrap();
}
