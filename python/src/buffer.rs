//! Python buffers (the buffer protocol) as byte slices the client reads from or writes into,
//! whatever their element type, with no copy. The buffer stays acquired (and its memory pinned)
//! for the life of these values; only the bytes cross into code that runs without the GIL.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

/// A C-contiguous buffer the caller lends for reading.
#[derive(Debug)]
pub(crate) struct Readable {
    buffer: PyUntypedBuffer,
}

impl Readable {
    pub(crate) fn get(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let buffer = PyUntypedBuffer::get(object).map_err(|_| {
            PyTypeError::new_err("expected a bytes-like object (bytes, bytearray, memoryview, numpy array)")
        })?;
        if !buffer.is_c_contiguous() {
            return Err(PyBufferError::new_err("the buffer is not C-contiguous"));
        }
        Ok(Self { buffer })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        let len = self.buffer.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the buffer is acquired for the life of `self` and C-contiguous, so its `len`
        // bytes start at `buf_ptr`. Python code could still write to it concurrently; the bytes
        // are then whatever they are, as with any C extension reading a buffer without the GIL.
        unsafe { std::slice::from_raw_parts(self.buffer.buf_ptr().cast::<u8>(), len) }
    }
}

/// A writable, C-contiguous buffer the caller lends for the client to fill.
#[derive(Debug)]
pub(crate) struct Writable {
    buffer: PyUntypedBuffer,
}

impl Writable {
    pub(crate) fn get(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let buffer = PyUntypedBuffer::get(object).map_err(|_| {
            PyTypeError::new_err(
                "expected a writable buffer (bytearray, memoryview, numpy array; for a torch tensor pass tensor.numpy())",
            )
        })?;
        if buffer.readonly() {
            return Err(PyBufferError::new_err("the buffer is read-only"));
        }
        if !buffer.is_c_contiguous() {
            return Err(PyBufferError::new_err("the buffer is not C-contiguous"));
        }
        Ok(Self { buffer })
    }

    pub(crate) fn len(&self) -> usize {
        self.buffer.len_bytes()
    }

    /// The bytes, for the client to write into. Take it once per call that runs without the GIL.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.buffer.len_bytes();
        if len == 0 {
            return &mut [];
        }
        // SAFETY: the buffer is writable, C-contiguous and acquired for the life of `self`; the
        // `&mut self` receiver keeps this the only slice handed out at a time.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.buf_ptr().cast::<u8>(), len) }
    }
}
