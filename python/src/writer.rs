//! Streaming PUT from Python: `Writer.write` hands bytes to a PUT running on the runtime through
//! a bounded channel, so memory stays bounded whatever the object size (the PUT keeps two
//! stripes; the channel `PIECES_IN_FLIGHT_MAX` pieces of at most `PIECE_BYTES` each).

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use pyo3::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::runtime::runtime;
use crate::{ObjectInfo, errors};

/// Small writes are gathered into pieces of this size before they cross the channel.
const PIECE_BYTES: usize = 1 << 20;
/// Pieces queued between the writer and the PUT.
const PIECES_IN_FLIGHT_MAX: usize = 2;

type Piece = Result<Vec<u8>, io::Error>;

/// The PUT's side of the channel: an `AsyncRead` over the pieces the writer sends.
struct ChannelSource {
    pieces: mpsc::Receiver<Piece>,
    current: Vec<u8>,
    consumed: usize,
}

impl AsyncRead for ChannelSource {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.consumed < self.current.len() {
                let take = buf.remaining().min(self.current.len() - self.consumed);
                let from = self.consumed;
                buf.put_slice(&self.current[from..from + take]);
                self.consumed += take;
                return Poll::Ready(Ok(()));
            }
            match self.pieces.poll_recv(cx) {
                Poll::Ready(Some(Ok(piece))) => {
                    self.current = piece;
                    self.consumed = 0;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                // The writer closed the channel: the end of the object.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[derive(Debug)]
struct Open {
    pieces: mpsc::Sender<Piece>,
    pending: Vec<u8>,
    put: JoinHandle<Result<client::ObjectInfo, client::Error>>,
    written: u64,
}

/// A PUT in progress, fed by `write` and finished by `close` (or dropped by `abort`).
#[pyclass(module = "tessera._tessera", frozen)]
#[derive(Debug)]
pub(crate) struct Writer {
    /// The process that started the PUT; a forked child cannot continue it.
    pid: u32,
    state: Mutex<Option<Open>>,
}

fn aborted() -> io::Error {
    io::Error::other("the writer was aborted")
}

impl Writer {
    pub(crate) fn start(client: client::Client, bucket: String, key: String, options: client::PutOptions) -> Self {
        let (sender, receiver) = mpsc::channel(PIECES_IN_FLIGHT_MAX);
        let put = runtime().spawn(async move {
            let mut source = ChannelSource { pieces: receiver, current: Vec::new(), consumed: 0 };
            client.put(&bucket, &key, &mut source, &options).await
        });
        let open = Open { pieces: sender, pending: Vec::with_capacity(PIECE_BYTES), put, written: 0 };
        Self { pid: std::process::id(), state: Mutex::new(Some(open)) }
    }

    /// The state, locked. Never waits: waiting for the lock with the GIL held while the holder
    /// waits for the GIL would deadlock, and a writer is not meant to be shared between threads.
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, Option<Open>>> {
        if self.pid != std::process::id() {
            return Err(pyo3::exceptions::PyValueError::new_err("this writer was opened by another process"));
        }
        match self.state.try_lock() {
            Ok(guard) => Ok(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                Err(pyo3::exceptions::PyRuntimeError::new_err("a writer is used by two threads at once"))
            }
        }
    }
}

fn closed() -> PyErr {
    pyo3::exceptions::PyValueError::new_err("I/O operation on a closed writer")
}

/// Sends one piece with the GIL released; `false` if the PUT has already ended (failed).
fn send(py: Python<'_>, sender: &mpsc::Sender<Piece>, piece: Piece) -> bool {
    py.detach(|| sender.blocking_send(piece).is_ok())
}

#[pymethods]
impl Writer {
    /// Appends `data` (any bytes-like object); returns its length.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buffer = crate::buffer::Readable::get(data)?;
        let mut guard = self.lock()?;
        let open = guard.as_mut().ok_or_else(closed)?;
        let bytes = buffer.as_slice();
        let len = bytes.len();
        let mut rest = bytes;
        while !rest.is_empty() {
            let take = rest.len().min(PIECE_BYTES - open.pending.len());
            open.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if open.pending.len() == PIECE_BYTES {
                let piece = std::mem::replace(&mut open.pending, Vec::with_capacity(PIECE_BYTES));
                if !send(py, &open.pieces, Ok(piece)) {
                    // The PUT failed: close and report its error.
                    let open = guard.take().expect("checked above");
                    return Err(finish(py, open).err().unwrap_or_else(closed));
                }
            }
        }
        open.written += len as u64;
        Ok(len)
    }

    /// Bytes written so far.
    fn tell(&self) -> PyResult<u64> {
        let guard = self.lock()?;
        Ok(guard.as_ref().ok_or_else(closed)?.written)
    }

    /// Ends the object and waits for the PUT to be acknowledged; returns its `ObjectInfo`.
    fn close(&self, py: Python<'_>) -> PyResult<ObjectInfo> {
        let mut open = self.lock()?.take().ok_or_else(closed)?;
        let pending = std::mem::take(&mut open.pending);
        if !pending.is_empty() {
            // A failed send means the PUT already ended; `finish` returns its error.
            send(py, &open.pieces, Ok(pending));
        }
        finish(py, open)
    }

    /// Drops the object: the PUT fails and leaves nothing behind. Idempotent.
    fn abort(&self, py: Python<'_>) {
        let Ok(mut guard) = self.lock() else { return };
        if let Some(open) = guard.take() {
            drop(guard);
            send(py, &open.pieces, Err(aborted()));
            // The PUT's error is the abort we asked for.
            let _ = finish(py, open);
        }
    }

    /// Whether `close` or `abort` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().map_or(true, |guard| guard.is_none())
    }
}

/// Closes the channel (the end of the source) and waits for the PUT.
fn finish(py: Python<'_>, open: Open) -> PyResult<ObjectInfo> {
    let Open { pieces, put, .. } = open;
    drop(pieces);
    let outcome = py.detach(|| runtime().block_on(put));
    match outcome {
        Ok(Ok(info)) => Ok(ObjectInfo::from(info)),
        Ok(Err(e)) => Err(errors::to_py(e)),
        Err(join) => Err(pyo3::exceptions::PyRuntimeError::new_err(format!("the PUT task failed: {join}"))),
    }
}

impl Drop for Writer {
    /// A writer dropped without `close` must not commit a truncated object: the PUT gets an
    /// error as its next piece and rolls back.
    fn drop(&mut self) {
        let taken = self.state.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if self.pid != std::process::id() {
            // The parent's PUT: its channel and task are not ours to touch.
            std::mem::forget(taken);
            return;
        }
        if let Some(open) = taken {
            let Open { pieces, .. } = open;
            if let Err(mpsc::error::TrySendError::Full(piece)) = pieces.try_send(Err(aborted())) {
                drop(piece);
                runtime().spawn(async move {
                    // Fails only if the PUT already ended, which is what we want.
                    let _ = pieces.send(Err(aborted())).await;
                });
            }
        }
    }
}
