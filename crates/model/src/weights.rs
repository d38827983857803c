//! Safetensors checkpoints: one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, looked up by their Hugging Face names.
//!
//! Only the headers are parsed when a checkpoint is opened (through a memory map that is dropped
//! right after); a tensor's bytes are read with a positioned read when it is converted or
//! uploaded, one tensor at a time. Reading rather than mapping is what makes a file that is cut
//! or rewritten while the model loads an error: a mapped page past a new end of file is a
//! SIGBUS that kills the process, a short read is a `Result`. A truncated or corrupt file is an
//! error naming the file (the header's offsets are checked against the file size before any
//! tensor is touched), never a panic.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use cubecl::prelude::*;
use half::{bf16, f16};
use memmap2::Mmap;
use ops::{DType, DeviceTensor};
use safetensors::tensor::{Metadata, SafeTensorError};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::error::{read_json, ModelError, Result};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One safetensors file, open, and its parsed header.
struct SafetensorsFile {
    path: PathBuf,
    file: File,
    /// Offset of the data section (8 + header length).
    data_start: u64,
    metadata: Metadata,
}

fn describe(err: &SafeTensorError) -> String {
    match err {
        SafeTensorError::HeaderTooSmall => {
            "shorter than the 8-byte header length (empty or truncated file)".into()
        }
        SafeTensorError::InvalidHeaderLength => {
            "the header length points past the end of the file (truncated file?)".into()
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "the data section does not match the sizes in the header (truncated or corrupt file)"
                .into()
        }
        SafeTensorError::HeaderTooLarge => {
            "the header length is implausibly large (corrupt file)".into()
        }
        SafeTensorError::InvalidHeader(_) | SafeTensorError::InvalidHeaderDeserialization(_) => {
            format!("the header is not valid JSON metadata ({err})")
        }
        other => other.to_string(),
    }
}

impl SafetensorsFile {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let len = file.metadata().map_err(|e| ModelError::io(path, e))?.len();
        if len < 8 {
            return Err(ModelError::Safetensors {
                path: path.to_path_buf(),
                detail: format!("{len} bytes is shorter than the 8-byte header length (empty or truncated file)"),
            });
        }
        // The header check needs the whole file's length as a buffer (the data section must end
        // at the end of the file); mapping it touches only the header's pages. SAFETY: the
        // mapping is read-only and dropped before this function returns.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.to_path_buf(),
                detail: describe(&e),
            })?;
        drop(mmap);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            data_start: 8 + header_len as u64,
            metadata,
        })
    }
}

/// A tensor of the checkpoint: its name, source dtype, shape, and where its bytes are
/// (little-endian; [`TensorRef::read`] reads them).
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub file: &'a Path,
    source: &'a File,
    /// Absolute offset and length of the bytes in the file.
    offset: u64,
    len: usize,
}

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor in the file.
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Reads the tensor's bytes (a file cut or changed since it was opened is an error).
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(self.len);
        self.read_append(&mut buf)?;
        Ok(buf)
    }

    /// Appends the tensor's bytes to `buf`.
    pub fn read_append(&self, buf: &mut Vec<u8>) -> Result<()> {
        let start = buf.len();
        buf.resize(start + self.len, 0);
        read_exact_at(self.source, &mut buf[start..], self.offset).map_err(|e| {
            buf.truncate(start);
            ModelError::Safetensors {
                path: self.file.to_path_buf(),
                detail: format!(
                    "reading tensor '{}' ({} bytes at offset {}): {e} (was the file changed while \
                 loading?)",
                    self.name, self.len, self.offset
                ),
            }
        })
    }

    /// Checks the shape against what the config implies.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(ModelError::TensorShape {
                name: self.name.to_string(),
                expected: expected.to_vec(),
                found: self.shape.to_vec(),
            });
        }
        Ok(())
    }

    /// The bytes read and converted to `to` on the host.
    pub fn bytes_as(&self, to: DType) -> Result<Vec<u8>> {
        let data = self.read()?;
        if self.dtype == to {
            return Ok(data);
        }
        Ok(convert(self.name, &data, self.dtype, to)?.into_owned())
    }

    /// The values as f32 (tests and host-side checks).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.len / self.dtype.size().max(1));
        self.append_f32(&mut out)?;
        Ok(out)
    }

    /// Appends the values to `out` as f32, converted straight from the file's f32, f16 or bf16
    /// bytes (what the host-side compression reads: one pass, no intermediate byte copy).
    pub fn append_f32(&self, out: &mut Vec<f32>) -> Result<()> {
        let data = self.read()?;
        match self.dtype {
            DType::F32 => out.extend(
                data.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            DType::F16 => out.extend(read_u16s(&data).map(|b| f16::from_bits(b).to_f32())),
            DType::BF16 => out.extend(read_u16s(&data).map(|b| bf16::from_bits(b).to_f32())),
            other => {
                return Err(ModelError::TensorDType {
                    name: self.name.to_string(),
                    found: other.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Uploads the tensor converted to `to` (conversion on the host, with `half`).
    pub fn upload<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        to: DType,
    ) -> Result<DeviceTensor<R>> {
        let bytes = self.bytes_as(to)?;
        Ok(DeviceTensor::from_bytes(client, &bytes, self.shape, to)?)
    }
}

fn source_dtype(name: &str, dtype: StDtype) -> Result<DType> {
    match dtype {
        StDtype::F32 => Ok(DType::F32),
        StDtype::F16 => Ok(DType::F16),
        StDtype::BF16 => Ok(DType::BF16),
        StDtype::I32 => Ok(DType::I32),
        StDtype::U32 => Ok(DType::U32),
        StDtype::I8 => Ok(DType::I8),
        StDtype::U8 => Ok(DType::U8),
        other => Err(ModelError::TensorDType {
            name: name.to_string(),
            found: format!("{other:?}"),
        }),
    }
}

fn read_u16s(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// Converts little-endian float bytes between f32, f16 and bf16, rounding to nearest even.
///
/// A finite value that overflows the target (bf16/f32 above 65504 into f16) is an error naming
/// the tensor rather than a silent infinity that would surface as NaN logits much later.
pub fn convert<'a>(name: &str, data: &'a [u8], from: DType, to: DType) -> Result<Cow<'a, [u8]>> {
    if from == to {
        return Ok(Cow::Borrowed(data));
    }
    let as_f32: Vec<f32> = match from {
        DType::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => read_u16s(data)
            .map(|b| f16::from_bits(b).to_f32())
            .collect(),
        DType::BF16 => read_u16s(data)
            .map(|b| bf16::from_bits(b).to_f32())
            .collect(),
        other => {
            return Err(ModelError::TensorDType {
                name: name.to_string(),
                found: other.to_string(),
            })
        }
    };
    let mut out = Vec::with_capacity(as_f32.len() * to.size());
    match to {
        DType::F32 => {
            for v in as_f32 {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for v in as_f32 {
                let h = f16::from_f32(v);
                if h.is_infinite() && v.is_finite() {
                    return Err(ModelError::TensorValue {
                        name: name.to_string(),
                        detail: format!("value {v} overflows f16; load with --dtype f32"),
                    });
                }
                out.extend_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for v in as_f32 {
                out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        other => {
            return Err(ModelError::TensorDType {
                name: name.to_string(),
                found: format!("conversion target {other}"),
            })
        }
    }
    Ok(Cow::Owned(out))
}

/// `buf.len()` bytes of `file` from `offset`, without moving a shared cursor where the platform
/// allows it.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}

/// The tensors of a checkpoint directory, by name.
pub struct WeightStore {
    dir: PathBuf,
    /// What to name in "missing tensor" errors: the single file or the index.
    source: PathBuf,
    files: Vec<SafetensorsFile>,
    /// name -> index into `files`.
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WeightStore {{ source: {}, files: {}, tensors: {} }}",
            self.source.display(),
            self.files.len(),
            self.by_name.len()
        )
    }
}

impl WeightStore {
    /// Opens `<dir>/model.safetensors.index.json` (sharded) or `<dir>/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(ModelError::io(dir, "no such model directory"));
        }
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_sharded(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_file(&single);
        }
        Err(ModelError::io(
            dir,
            format!("neither {SINGLE_FILE} nor {INDEX_FILE} found (only safetensors checkpoints are supported)"),
        ))
    }

    /// Opens one safetensors file by path (any name), e.g. a reference-data file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let file = SafetensorsFile::open(path)?;
        let by_name = file
            .metadata
            .tensors()
            .into_keys()
            .map(|name| (name, 0))
            .collect();
        Ok(Self {
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            source: path.to_path_buf(),
            files: vec![file],
            by_name,
        })
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Self> {
        let json = read_json(index)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::config(index, "weight_map", "missing or not an object"))?;
        // Shards in a stable order (BTreeMap) so that loading order does not depend on hashing.
        let mut shard_of: BTreeMap<String, usize> = BTreeMap::new();
        let mut wanted: Vec<(String, String)> = Vec::with_capacity(map.len());
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                ModelError::config(index, format!("weight_map.{name}"), "expected a file name")
            })?;
            if file.contains("..") || Path::new(file).is_absolute() {
                return Err(ModelError::config(
                    index,
                    format!("weight_map.{name}"),
                    format!("shard '{file}' is outside the model directory"),
                ));
            }
            let next = shard_of.len();
            shard_of.entry(file.to_string()).or_insert(next);
            wanted.push((name.clone(), file.to_string()));
        }
        let mut ordered: Vec<(&String, &usize)> = shard_of.iter().collect();
        ordered.sort_by_key(|(_, &i)| i);
        let files = ordered
            .into_iter()
            .map(|(f, _)| SafetensorsFile::open(&dir.join(f)))
            .collect::<Result<Vec<_>>>()?;
        let mut by_name = HashMap::with_capacity(wanted.len());
        for (name, file) in wanted {
            let i = shard_of[&file];
            if files[i].metadata.info(&name).is_none() {
                return Err(ModelError::MissingTensor {
                    name,
                    path: files[i].path.clone(),
                });
            }
            by_name.insert(name, i);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            source: index.to_path_buf(),
            files,
            by_name,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file named in errors about missing tensors.
    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Looks a tensor up by its Hugging Face name.
    pub fn get(&self, name: &str) -> Result<TensorRef<'_>> {
        let (key, &i) =
            self.by_name
                .get_key_value(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                    path: self.source.clone(),
                })?;
        let file = &self.files[i];
        let info = file
            .metadata
            .info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                path: file.path.clone(),
            })?;
        let (s, e) = info.data_offsets;
        // read_metadata checked that the offsets are contiguous and end at the file's end.
        Ok(TensorRef {
            name: key,
            dtype: source_dtype(name, info.dtype)?,
            shape: &info.shape,
            file: &file.path,
            source: &file.file,
            offset: file.data_start + s as u64,
            len: e - s,
        })
    }

    /// Looks a float weight up and checks its shape (integer tensors are refused by name).
    pub fn expect(&self, name: &str, shape: &[usize]) -> Result<TensorRef<'_>> {
        let t = self.get(name)?;
        if !t.dtype.is_float() {
            return Err(ModelError::TensorDType {
                name: name.to_string(),
                found: t.dtype.name().to_uppercase(),
            });
        }
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// An i32 tensor's values (reference data such as token ids).
    pub fn i32s(&self, name: &str) -> Result<Vec<i32>> {
        let t = self.get(name)?;
        if t.dtype != DType::I32 {
            return Err(ModelError::TensorDType {
                name: name.to_string(),
                found: t.dtype.name().to_uppercase(),
            });
        }
        Ok(t.read()?
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
