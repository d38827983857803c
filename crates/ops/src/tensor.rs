//! The device tensor: a [`TensorHandle`] (buffer + shape + strides) with our [`DType`].

use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl_std::tensor::TensorHandle;

use crate::dtype::{bytes_to_f64, f32_to_bytes, HostElement};
use crate::{DType, OpsError, Result};

/// A tensor living on the device of a CubeCL runtime `R`.
///
/// Cloning is cheap (the buffer is reference counted). Views made by [`DeviceTensor::reshape`]
/// share the buffer. Strides are in elements; ops that need contiguous inputs say so and return
/// [`OpsError::ShapeMismatch`] otherwise.
pub struct DeviceTensor<R: Runtime> {
    inner: TensorHandle<R>,
    dtype: DType,
}

impl<R: Runtime> Clone for DeviceTensor<R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            dtype: self.dtype,
        }
    }
}

impl<R: Runtime> std::fmt::Debug for DeviceTensor<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTensor {{ shape: {:?}, strides: {:?}, dtype: {} }}",
            self.shape(),
            self.strides(),
            self.dtype
        )
    }
}

pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

impl<R: Runtime> DeviceTensor<R> {
    /// Wraps a buffer that holds `shape` contiguous elements of `dtype`.
    pub fn from_handle(handle: Handle, shape: &[usize], dtype: DType) -> Self {
        let strides = contiguous_strides(shape);
        Self::from_parts(handle, shape, &strides, dtype)
    }

    /// Wraps a buffer with explicit strides (in elements).
    pub fn from_parts(handle: Handle, shape: &[usize], strides: &[usize], dtype: DType) -> Self {
        let inner = TensorHandle::new(handle, shape.to_vec(), strides.to_vec(), dtype.elem_type());
        Self { inner, dtype }
    }

    /// Wraps a cubecl-std tensor handle (e.g. one produced by cubek or Burn).
    pub fn from_tensor_handle(inner: TensorHandle<R>) -> Result<Self> {
        let dtype = DType::ALL
            .into_iter()
            .find(|d| d.elem_type() == inner.dtype)
            .ok_or_else(|| {
                OpsError::invalid("DeviceTensor", format!("no DType for {}", inner.dtype))
            })?;
        Ok(Self { inner, dtype })
    }

    /// Allocates an uninitialised contiguous tensor.
    pub fn empty(client: &ComputeClient<R>, shape: &[usize], dtype: DType) -> Self {
        // A zero-sized buffer is not valid on every backend: keep at least one element.
        let bytes = (shape.iter().product::<usize>() * dtype.size()).max(4);
        Self::from_handle(client.empty(bytes), shape, dtype)
    }

    /// Uploads host values of their own dtype.
    pub fn from_slice<T: HostElement>(
        client: &ComputeClient<R>,
        data: &[T],
        shape: &[usize],
    ) -> Result<Self> {
        Self::check_len("DeviceTensor::from_slice", data.len(), shape)?;
        Ok(Self::upload_bytes(
            client,
            bytemuck::cast_slice(data),
            shape,
            T::DTYPE,
        ))
    }

    /// Uploads f32 values converted to a float dtype (f32, f16 or bf16, rounded to nearest).
    pub fn from_f32(
        client: &ComputeClient<R>,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        Self::check_len("DeviceTensor::from_f32", data.len(), shape)?;
        let bytes = f32_to_bytes(data, dtype).ok_or_else(|| {
            OpsError::invalid(
                "DeviceTensor::from_f32",
                format!("{dtype} is not a float dtype"),
            )
        })?;
        Ok(Self::upload_bytes(client, &bytes, shape, dtype))
    }

    /// Uploads raw little-endian bytes of `dtype` (e.g. straight from a safetensors file).
    pub fn from_bytes(
        client: &ComputeClient<R>,
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * dtype.size() {
            return Err(OpsError::shape(
                "DeviceTensor::from_bytes",
                format!(
                    "{} bytes for shape {shape:?} of {dtype} (needs {})",
                    bytes.len(),
                    numel * dtype.size()
                ),
            ));
        }
        Ok(Self::upload_bytes(client, bytes, shape, dtype))
    }

    fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
        let numel: usize = shape.iter().product();
        if len != numel {
            return Err(OpsError::shape(
                op,
                format!("{len} values for shape {shape:?} ({numel} elements)"),
            ));
        }
        Ok(())
    }

    fn upload_bytes(
        client: &ComputeClient<R>,
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
    ) -> Self {
        let handle = if bytes.is_empty() {
            client.empty(4)
        } else {
            client.create_from_slice(bytes)
        };
        Self::from_handle(handle, shape, dtype)
    }

    pub fn shape(&self) -> &[usize] {
        self.inner.shape()
    }

    pub fn strides(&self) -> &[usize] {
        self.inner.strides()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Size of the last dimension (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.shape().last().copied().unwrap_or(1)
    }

    /// Number of rows when viewed as `[numel / last_dim, last_dim]`.
    pub fn rows(&self) -> usize {
        self.numel() / self.last_dim().max(1)
    }

    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&dim, &stride) in self.shape().iter().zip(self.strides()).rev() {
            if dim != 1 && stride != expected {
                return false;
            }
            expected *= dim;
        }
        true
    }

    pub fn handle(&self) -> &Handle {
        &self.inner.handle
    }

    pub fn tensor_handle(&self) -> &TensorHandle<R> {
        &self.inner
    }

    pub fn into_tensor_handle(self) -> TensorHandle<R> {
        self.inner
    }

    /// A view with another shape over the same contiguous buffer.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if !self.is_contiguous() {
            return Err(OpsError::shape(
                "reshape",
                "only a contiguous tensor can be reshaped",
            ));
        }
        if shape.iter().product::<usize>() != self.numel() {
            return Err(OpsError::shape(
                "reshape",
                format!("{:?} into {shape:?}", self.shape()),
            ));
        }
        Ok(Self::from_handle(self.handle().clone(), shape, self.dtype))
    }

    /// A strided view: the same buffer seen with other shape/strides (checked to stay inside).
    pub fn view(&self, shape: &[usize], strides: &[usize]) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(OpsError::shape("view", "shape and strides differ in rank"));
        }
        let last = shape
            .iter()
            .zip(strides)
            .map(|(&d, &s)| d.saturating_sub(1) * s)
            .sum::<usize>();
        let capacity = self.handle().size_in_used() as usize / self.dtype.size();
        if shape.iter().product::<usize>() > 0 && last >= capacity {
            return Err(OpsError::shape(
                "view",
                format!("{shape:?}/{strides:?} reaches past {capacity} elements"),
            ));
        }
        Ok(Self::from_parts(
            self.handle().clone(),
            shape,
            strides,
            self.dtype,
        ))
    }

    /// The argument for a kernel that takes this tensor as a flat slice of `len` elements.
    ///
    /// # Safety
    /// The caller checked that the kernel reads at most `numel` elements of a contiguous tensor.
    pub unsafe fn as_buffer_arg(&self) -> BufferArg<R> {
        unsafe { BufferArg::from_raw_parts(self.handle().clone(), self.numel()) }
    }

    /// The argument for a kernel that takes this tensor with its shape and strides.
    ///
    /// # Safety
    /// The strides and shape describe memory inside the buffer (checked at construction).
    pub unsafe fn as_tensor_arg(&self) -> TensorArg<R> {
        unsafe {
            TensorArg::from_raw_parts(
                self.handle().clone(),
                self.strides().into(),
                self.shape().into(),
            )
        }
    }

    /// Reads the whole buffer and gathers the elements in logical (row-major) order.
    pub fn to_bytes(&self, client: &ComputeClient<R>) -> Result<Vec<u8>> {
        let bytes = client
            .read_one(self.handle().clone())
            .map_err(|e| OpsError::Device {
                op: "DeviceTensor::read",
                detail: format!("{e:?}"),
            })?;
        let size = self.dtype.size();
        let numel = self.numel();
        if self.is_contiguous() {
            return Ok(bytes[..numel * size].to_vec());
        }
        let shape = self.shape().to_vec();
        let strides = self.strides().to_vec();
        let mut out = Vec::with_capacity(numel * size);
        let mut index = vec![0usize; shape.len()];
        for _ in 0..numel {
            let offset: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
            out.extend_from_slice(&bytes[offset * size..(offset + 1) * size]);
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(out)
    }

    /// Queues a download of a contiguous tensor behind the work already submitted on `client`'s
    /// stream and returns without waiting. A decode loop uses it to read a step's chosen token
    /// while the next step, fed that token on the device, runs.
    ///
    /// On CUDA a read of at most 64 bytes is copied on a stream of its own, after the work
    /// already submitted, so that the copy does not hold up the work submitted next; that work
    /// must then not write the tensor before [`PendingRead::wait`] returns. Larger reads, and
    /// every read on the other runtimes, are ordered before the work submitted afterwards.
    pub fn read_queued<'a>(&self, client: &'a ComputeClient<R>) -> Result<PendingRead<'a>> {
        if !self.is_contiguous() {
            return Err(OpsError::invalid(
                "DeviceTensor::read_queued",
                "the tensor is not contiguous",
            ));
        }
        Ok(PendingRead {
            bytes: Box::pin(client.read_async(vec![self.handle().clone()])),
            len: self.numel() * self.dtype.size(),
            dtype: self.dtype,
        })
    }

    /// Downloads the values as their own host type (the dtype must match `T`).
    pub fn to_vec<T: HostElement>(&self, client: &ComputeClient<R>) -> Result<Vec<T>> {
        check_host_type::<T>("DeviceTensor::to_vec", self.dtype)?;
        Ok(bytemuck::pod_collect_to_vec(&self.to_bytes(client)?))
    }

    /// Downloads any dtype as f64 (exact for every dtype we have).
    pub fn to_f64_vec(&self, client: &ComputeClient<R>) -> Result<Vec<f64>> {
        Ok(bytes_to_f64(&self.to_bytes(client)?, self.dtype))
    }

    /// Downloads any dtype as f32.
    pub fn to_f32_vec(&self, client: &ComputeClient<R>) -> Result<Vec<f32>> {
        Ok(self
            .to_f64_vec(client)?
            .into_iter()
            .map(|v| v as f32)
            .collect())
    }

    /// Overwrites the contents with host bytes of the same size (e.g. poisoning in tests, or
    /// refreshing a graph's input buffer).
    pub fn write_bytes(&self, client: &ComputeClient<R>, bytes: &[u8]) -> Result<()> {
        if !self.is_contiguous() || bytes.len() != self.numel() * self.dtype.size() {
            return Err(OpsError::shape(
                "DeviceTensor::write_bytes",
                format!(
                    "{} bytes into {:?} of {}",
                    bytes.len(),
                    self.shape(),
                    self.dtype
                ),
            ));
        }
        client.write(
            self.handle(),
            cubecl_environment::bytes::Bytes::from_bytes_vec(bytes.to_vec()),
        );
        Ok(())
    }
}

/// Errors unless host values of type `T` are what a tensor of `dtype` holds.
fn check_host_type<T: HostElement>(op: &'static str, dtype: DType) -> Result<()> {
    if T::DTYPE != dtype {
        return Err(OpsError::invalid(
            op,
            format!("tensor is {} but {} was asked for", dtype, T::DTYPE),
        ));
    }
    Ok(())
}

/// A download queued by [`DeviceTensor::read_queued`] (it borrows the client that queued it).
pub struct PendingRead<'a> {
    #[allow(clippy::type_complexity)]
    bytes: std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = std::result::Result<
                        Vec<cubecl::bytes::Bytes>,
                        cubecl::server::ServerError,
                    >,
                > + Send
                + 'a,
        >,
    >,
    len: usize,
    dtype: DType,
}

impl PendingRead<'_> {
    /// Waits for the download (and everything queued before it) and returns the values as
    /// their own host type (the dtype must match `T`).
    pub fn wait<T: HostElement>(self) -> Result<Vec<T>> {
        check_host_type::<T>("PendingRead::wait", self.dtype)?;
        let mut bytes = cubecl::future::block_on(self.bytes).map_err(|e| OpsError::Device {
            op: "DeviceTensor::read_queued",
            detail: format!("{e:?}"),
        })?;
        let first = bytes.remove(0);
        Ok(bytemuck::pod_collect_to_vec(&first[..self.len]))
    }
}
