//! The element types a model's weights may be stored in.

use std::fmt;

/// A weight element type. Models are stored in [`DType::F16`] or [`DType::BF16`];
/// [`DType::F32`] is accepted in `config.json` (Hugging Face's default when absent) but not
/// for the weights themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 half precision (`torch.float16`).
    F16,
    /// bfloat16 (`torch.bfloat16`).
    BF16,
    /// IEEE 754 single precision (`torch.float32`).
    F32,
}

impl DType {
    /// The type `torch_dtype` names (`"float16"`, `"bfloat16"`, `"float32"`).
    pub fn from_torch_name(name: &str) -> Option<Self> {
        match name {
            "float16" | "half" => Some(DType::F16),
            "bfloat16" => Some(DType::BF16),
            "float32" | "float" => Some(DType::F32),
            _ => None,
        }
    }

    /// The name `config.json` gives this type.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
        }
    }

    /// The size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }

    /// The safetensors type of the same name.
    pub fn to_safetensors(self) -> safetensors::Dtype {
        match self {
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
            DType::F32 => safetensors::Dtype::F32,
        }
    }

    /// The type of a safetensors tensor, if it is one of these.
    pub fn from_safetensors(dtype: safetensors::Dtype) -> Option<Self> {
        match dtype {
            safetensors::Dtype::F16 => Some(DType::F16),
            safetensors::Dtype::BF16 => Some(DType::BF16),
            safetensors::Dtype::F32 => Some(DType::F32),
            _ => None,
        }
    }

    /// Decodes little-endian elements of this type into `out` (as many as `out` holds or
    /// `bytes` contains, whichever is fewer).
    pub fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            DType::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            DType::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    // bfloat16 is the high half of an f32: exact, no rounding.
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
            DType::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }

    /// Decodes little-endian elements of this type into a new vector.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; bytes.len() / self.size()];
        self.decode_into(bytes, &mut out);
        out
    }

    /// Appends `value` rounded to this type, little-endian.
    pub fn encode(self, value: f32, out: &mut Vec<u8>) {
        match self {
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(value).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&value.to_le_bytes()),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_rounds_to_the_type() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let values = [0.0f32, 1.0, -2.5, 0.019_999, 65504.0];
            let mut bytes = Vec::new();
            for v in values {
                dtype.encode(v, &mut bytes);
            }
            assert_eq!(bytes.len(), values.len() * dtype.size());
            let back = dtype.decode(&bytes);
            for (v, b) in values.iter().zip(&back) {
                let tolerance = match dtype {
                    DType::F16 => 1e-3,
                    DType::BF16 => 8e-3,
                    DType::F32 => 0.0,
                };
                assert!((v - b).abs() <= tolerance * v.abs(), "{dtype}: {v} -> {b}");
            }
        }
        // bf16 1.0 is 0x3F80; f16 1.0 is 0x3C00.
        assert_eq!(DType::BF16.decode(&[0x80, 0x3F]), vec![1.0]);
        assert_eq!(DType::F16.decode(&[0x00, 0x3C]), vec![1.0]);
    }

    #[test]
    fn names_round_trip() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            assert_eq!(DType::from_torch_name(dtype.torch_name()), Some(dtype));
            assert_eq!(DType::from_safetensors(dtype.to_safetensors()), Some(dtype));
        }
        assert_eq!(DType::from_torch_name("int8"), None);
    }
}
