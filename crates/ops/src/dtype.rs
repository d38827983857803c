//! Element types of device tensors and the host types that map onto them.

use cubecl::ir::{ElemType, FloatKind, IntKind, UIntKind};
use half::{bf16, f16};

/// The element type of a [`crate::DeviceTensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// fp8 e4m3 (OCP "fn" variant: no infinities, max 448), stored as one byte.
    F8E4M3,
    I8,
    U8,
    I32,
    U32,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
    ];

    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::I8 | DType::U8 => 1,
        }
    }

    /// True for the dtypes float kernels accept as activations (f32, f16, bf16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn elem_type(self) -> ElemType {
        match self {
            DType::F32 => ElemType::Float(FloatKind::F32),
            DType::F16 => ElemType::Float(FloatKind::F16),
            DType::BF16 => ElemType::Float(FloatKind::BF16),
            DType::F8E4M3 => ElemType::Float(FloatKind::E4M3),
            DType::I8 => ElemType::Int(IntKind::I8),
            DType::U8 => ElemType::UInt(UIntKind::U8),
            DType::I32 => ElemType::Int(IntKind::I32),
            DType::U32 => ElemType::UInt(UIntKind::U32),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    /// Parses the names `name` prints (`"bf16"`, ...), case-insensitively.
    pub fn parse(s: &str) -> Option<DType> {
        Self::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host element type that can be uploaded to / downloaded from a device tensor as it is.
pub trait HostElement: bytemuck::Pod + Copy + Send + Sync + 'static {
    const DTYPE: DType;
    /// Lossless for every type but the wide integers, which tests keep small.
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! host_element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl HostElement for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}

host_element!(f32, DType::F32, |x| x as f64, |v| v as f32);
host_element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
host_element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
host_element!(i8, DType::I8, |x| x as f64, |v| v as i8);
host_element!(u8, DType::U8, |x| x as f64, |v| v as u8);
host_element!(i32, DType::I32, |x| x as f64, |v| v as i32);
host_element!(u32, DType::U32, |x| x as f64, |v| v as u32);

/// Converts f32 values into the bytes of a float dtype (f32, f16, bf16), rounding to nearest.
pub fn f32_to_bytes(values: &[f32], dtype: DType) -> Option<Vec<u8>> {
    Some(match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => {
            let v: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::BF16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        _ => return None,
    })
}

/// Decodes the bytes of any dtype into f64 values (fp8 e4m3 decoded exactly).
pub fn bytes_to_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    fn cast<T: HostElement>(b: &[u8]) -> Vec<f64> {
        bytemuck::pod_collect_to_vec::<u8, T>(b)
            .into_iter()
            .map(T::to_f64)
            .collect()
    }
    match dtype {
        DType::F32 => cast::<f32>(bytes),
        DType::F16 => cast::<f16>(bytes),
        DType::BF16 => cast::<bf16>(bytes),
        DType::I8 => cast::<i8>(bytes),
        DType::U8 => cast::<u8>(bytes),
        DType::I32 => cast::<i32>(bytes),
        DType::U32 => cast::<u32>(bytes),
        DType::F8E4M3 => bytes.iter().map(|&b| e4m3_to_f64(b)).collect(),
    }
}

/// Decodes one fp8 e4m3 (OCP "fn") byte.
pub fn e4m3_to_f64(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 0x7) as f64;
    if exp == 0xF && (b & 0x7) == 0x7 {
        return f64::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}
