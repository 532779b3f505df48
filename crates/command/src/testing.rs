//! Test images shared with other crates' tests: [`ElfImage`], a small cubin container written
//! section by section, for tests of what reads cubins (the image checks, the parameter counts, a
//! driver that loads them).

/// `SHT_PROGBITS`: a section of file bytes.
const SHT_PROGBITS: u32 = 1;
/// `SHT_STRTAB`: the section name table.
const SHT_STRTAB: u32 = 3;
/// `SHT_NOBITS`: a section that occupies no file bytes.
const SHT_NOBITS: u32 = 8;
/// The sizes of the ELF header and of a section header, 64-bit.
const HEADER_BYTES: usize = 0x40;

/// A 64-bit little-endian ELF image with no program headers, as a cubin is: the header, the
/// section name table (`.shstrtab`, section 1), the bytes of each section added, in order, then
/// the section header table (the null section, `.shstrtab`, then the sections added).
#[derive(Clone, Debug, Default)]
pub struct ElfImage {
    ident: [u8; 8],
    sections: Vec<(String, Contents)>,
}

#[derive(Clone, Debug)]
enum Contents {
    Bytes(Vec<u8>),
    /// The length a section with no file bytes declares.
    NoBits(usize),
}

impl ElfImage {
    /// An image with no section but the name table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `bytes` over bytes 6 to 13 of the identification (the version, the ABI and
    /// padding), which no reader of cubins looks at: a reader that takes the image as text up to
    /// its first NUL reads them after `\x7fELF\x02\x01`.
    pub fn ident_text(mut self, bytes: [u8; 8]) -> Self {
        self.ident = bytes;
        self
    }

    /// Adds a section `name` of `bytes`.
    pub fn section(mut self, name: &str, bytes: &[u8]) -> Self {
        self.sections
            .push((name.to_owned(), Contents::Bytes(bytes.to_vec())));
        self
    }

    /// Adds a section `name` that occupies no file bytes (`SHT_NOBITS`, as static shared
    /// memory's `.nv.shared.*` in a real cubin): it declares `len` bytes from the end of the
    /// file.
    pub fn no_bits(mut self, name: &str, len: usize) -> Self {
        self.sections.push((name.to_owned(), Contents::NoBits(len)));
        self
    }

    /// The image's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name = |text: &str| {
            let at = names.len() as u32;
            names.extend_from_slice(text.as_bytes());
            names.push(0);
            at
        };
        let shstrtab = name(".shstrtab");
        let named: Vec<u32> = self.sections.iter().map(|(text, _)| name(text)).collect();
        let mut image = vec![0u8; HEADER_BYTES];
        image[..6].copy_from_slice(b"\x7fELF\x02\x01");
        image[6..14].copy_from_slice(&self.ident);
        // (name, type, offset, size) of each section; a section with no file bytes (offset
        // `None`) starts at the end of the file.
        let mut headers = vec![
            (0, 0, Some(0), 0),
            (shstrtab, SHT_STRTAB, Some(image.len()), names.len()),
        ];
        image.extend_from_slice(&names);
        for ((_, contents), name) in self.sections.iter().zip(named) {
            headers.push(match contents {
                Contents::Bytes(bytes) => {
                    image.extend_from_slice(bytes);
                    (
                        name,
                        SHT_PROGBITS,
                        Some(image.len() - bytes.len()),
                        bytes.len(),
                    )
                }
                Contents::NoBits(len) => (name, SHT_NOBITS, None, *len),
            });
        }
        let count = headers.len();
        let end = image.len() + count * HEADER_BYTES;
        let shoff = image.len() as u64;
        image[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        image[0x34..0x36].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&(count as u16).to_le_bytes());
        image[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        for (name, kind, offset, size) in headers {
            let mut header = [0u8; HEADER_BYTES];
            header[..4].copy_from_slice(&name.to_le_bytes());
            header[4..8].copy_from_slice(&kind.to_le_bytes());
            header[0x18..0x20].copy_from_slice(&(offset.unwrap_or(end) as u64).to_le_bytes());
            header[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            image.extend_from_slice(&header);
        }
        image
    }
}

#[cfg(test)]
mod tests {
    use super::ElfImage;
    use crate::image::check_image;

    /// Every section the builder writes lies inside the image (a section with no file bytes
    /// aside), and a cut that leaves the section header table out is refused.
    #[test]
    fn a_built_image_passes_the_image_checks() {
        let image = ElfImage::new()
            .section(".nv.info.k", &[1, 2, 3])
            .no_bits(".nv.shared.k", 0x1000)
            .build();
        assert_eq!(check_image(&image), Ok(()));
        assert_eq!(
            check_image(&image[..super::HEADER_BYTES]),
            Err("the ELF section headers lie past the end of the image")
        );
    }
}
