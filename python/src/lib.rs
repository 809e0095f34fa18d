//! `tessera._tessera`: the PyO3 glue between the Rust smart client (`client`) and the `tessera`
//! Python package. Glue only: conversions, releasing the GIL around every blocking call, and
//! mapping `client::Error` to the exceptions of `tessera.errors`.
//!
//! Main types: [`RawClient`] (one cluster; safe to share between threads and to use after
//! `fork`), [`ObjectInfo`] (one object version, also the handle for ranged reads) and
//! [`writer::Writer`] (a streaming PUT). Reads land straight in the caller's buffer: the
//! client's scatter-gather GET writes each chunk into its place in the Python buffer's memory.
//!
//! ```python
//! from tessera._tessera import RawClient
//! raw = RawClient("tessera-data/cluster.toml", None, None)
//! raw.put("bkt", "hello.txt", b"hello", None, [])
//! buf = bytearray(5)
//! raw.get_into("bkt", "hello.txt", buf, 0)
//! ```
//!
//! Cargo features: none.

mod buffer;
mod errors;
mod query;
mod runtime;
mod writer;

use std::net::SocketAddr;
use std::path::Path;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use buffer::{Readable, Writable};
use runtime::{PerProcess, runtime};

/// A slice of memory that stays valid while the GIL is released (a Python buffer held by the
/// caller, or a fresh `bytes` object nobody else can see yet).
struct RawSlice {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by a Python object kept alive by the calling frame, and only the
// thread that made the `RawSlice` touches it until the call returns.
unsafe impl Send for RawSlice {}

impl RawSlice {
    fn of(slice: &mut [u8]) -> Self {
        Self { ptr: slice.as_mut_ptr(), len: slice.len() }
    }

    /// # Safety
    /// The memory must still be alive and not aliased by another live slice.
    unsafe fn as_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A `bytes` object of `len` uninitialised bytes, and its memory, to be filled before anyone
/// else sees it.
fn fresh_bytes(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyBytes>, RawSlice)> {
    let size = pyo3::ffi::Py_ssize_t::try_from(len).map_err(|_| PyValueError::new_err("object too large"))?;
    // SAFETY: PyBytes_FromStringAndSize(NULL, n) returns a new bytes object with room for n
    // bytes (or NULL with an exception set); PyBytes_AsString points at that room.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size);
        let bytes = Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked::<PyBytes>();
        let data = pyo3::ffi::PyBytes_AsString(ptr).cast::<u8>();
        Ok((bytes, RawSlice { ptr: data, len }))
    }
}

/// One object version: its metadata, and the handle for ranged reads of exactly that version.
#[pyclass(module = "tessera._tessera", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct ObjectInfo {
    inner: client::ObjectInfo,
}

impl From<client::ObjectInfo> for ObjectInfo {
    fn from(inner: client::ObjectInfo) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl ObjectInfo {
    #[getter]
    fn bucket(&self) -> &str {
        &self.inner.meta.bucket
    }
    #[getter]
    fn key(&self) -> &str {
        &self.inner.meta.key
    }
    #[getter]
    fn size(&self) -> u64 {
        self.inner.meta.size
    }
    /// Bytes of the stream the chunks hold: the size, plus the zeros of an aligned layout.
    #[getter]
    fn stored_size(&self) -> u64 {
        self.inner.meta.stored_size()
    }
    /// Bytes per chunk (the cluster's, or the aligned layout's).
    #[getter]
    fn chunk_bytes(&self) -> u32 {
        self.inner.meta.chunk_bytes
    }

    /// Bytes per checksum block: a ranged read fetches and verifies whole blocks.
    #[getter]
    fn block_bytes(&self) -> u32 {
        self.inner.meta.block_bytes
    }

    /// "aligned" (each Parquet row group inside one chunk) or "plain".
    #[getter]
    fn layout(&self) -> &'static str {
        if self.inner.meta.pads.is_empty() { "plain" } else { "aligned" }
    }
    #[getter]
    fn etag(&self) -> &str {
        &self.inner.meta.etag
    }
    #[getter]
    fn content_type(&self) -> &str {
        &self.inner.meta.content_type
    }
    #[getter]
    fn user_meta(&self) -> std::collections::HashMap<String, String> {
        self.inner.meta.user_meta.iter().cloned().collect()
    }
    #[getter]
    fn modified_ms(&self) -> u64 {
        self.inner.meta.modified_ms
    }
    #[getter]
    fn version(&self) -> String {
        self.inner.meta.version.to_hex()
    }
    #[getter]
    fn k(&self) -> u8 {
        self.inner.meta.k
    }
    #[getter]
    fn m(&self) -> u8 {
        self.inner.meta.m
    }
    #[getter]
    fn parts(&self) -> usize {
        self.inner.meta.parts.len()
    }
    fn __repr__(&self) -> String {
        let meta = &self.inner.meta;
        format!("ObjectInfo({}/{}, size={}, etag={:?})", meta.bucket, meta.key, meta.size, meta.etag)
    }
}

/// A client of one cluster. Thread-safe; after `fork`, the child builds its own connections on
/// first use.
#[pyclass(module = "tessera._tessera", frozen)]
#[derive(Debug)]
pub(crate) struct RawClient {
    /// Holds the cluster map; never does I/O itself. Each process builds its own client from it.
    template: client::Client,
    client: PerProcess<client::Client>,
    /// The gather row cache's capacity in bytes (0: off), and this process's cache.
    cache_bytes: std::sync::atomic::AtomicU64,
    cache: PerProcess<std::sync::Arc<client::RowCache>>,
}

fn options() -> client::ClientOptions {
    client::ClientOptions::default()
}

fn put_options(content_type: Option<String>, user_meta: Vec<(String, String)>) -> client::PutOptions {
    client::PutOptions { content_type, user_meta, ..Default::default() }
}

impl RawClient {
    /// This process's client.
    fn client(&self) -> PyResult<client::Client> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let client = client::Client::new((*self.template.map()).clone(), options()).map_err(errors::to_py)?;
        Ok(self.client.set(client))
    }

    /// This process's row cache, if gathers are to use one (a forked child starts empty).
    fn row_cache(&self) -> Option<std::sync::Arc<client::RowCache>> {
        let bytes = self.cache_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if bytes == 0 {
            return None;
        }
        match self.cache.get() {
            Some(cache) if cache.stats().capacity_bytes == bytes => Some(cache),
            _ => {
                let fresh = std::sync::Arc::new(client::RowCache::new(bytes));
                self.cache.replace(std::sync::Arc::clone(&fresh));
                Some(fresh)
            }
        }
    }

    /// Runs `f` on the runtime with the GIL released.
    fn block<T: Send, F>(&self, py: Python<'_>, f: impl FnOnce(client::Client) -> F + Send) -> PyResult<T>
    where
        F: Future<Output = Result<T, client::Error>> + Send,
    {
        let client = self.client()?;
        py.detach(|| runtime().block_on(f(client))).map_err(errors::to_py)
    }
}

#[pymethods]
impl RawClient {
    /// A client from `config` (a cluster.toml path) or from a node `address` and the cluster
    /// `secret` (the map is fetched from that node).
    #[new]
    #[pyo3(signature = (config, address, secret))]
    fn new(py: Python<'_>, config: Option<String>, address: Option<String>, secret: Option<String>) -> PyResult<Self> {
        let template = match (config, address) {
            (Some(path), None) => load_config(py, &path)?,
            (None, Some(address)) => {
                let addr: SocketAddr = address.parse().map_err(|_| {
                    errors::raise(
                        py,
                        "ConfigError",
                        format!("invalid node address {address:?}: expected HOST:PORT"),
                        &[],
                    )
                })?;
                let Some(secret) = secret else {
                    return Err(errors::raise(
                        py,
                        "ConfigError",
                        "connecting to a node address needs the cluster secret: set TESSERA_CLUSTER_SECRET".into(),
                        &[],
                    ));
                };
                let client = py
                    .detach(|| runtime().block_on(client::Client::bootstrap(addr, &secret, options())))
                    .map_err(errors::to_py)?;
                client::Client::new((*client.map()).clone(), options()).map_err(errors::to_py)?
            }
            _ => return Err(PyValueError::new_err("pass exactly one of config and address")),
        };
        Ok(Self {
            template,
            client: PerProcess::new(),
            cache_bytes: std::sync::atomic::AtomicU64::new(0),
            cache: PerProcess::new(),
        })
    }

    /// Starts `sql` (tables are quoted paths, 'bucket/key' or 'bucket/prefix/'): filters and
    /// projections run on the nodes unless `pushdown` is false. `memory` bounds the client's
    /// engine (bytes).
    fn query(&self, py: Python<'_>, sql: String, pushdown: bool, memory: usize) -> PyResult<query::QueryCursor> {
        query::QueryCursor::start(py, self.client()?, sql, pushdown, memory)
    }

    /// Nodes in the cluster map and the erasure code, for display.
    fn describe(&self) -> String {
        let map = self.template.map();
        format!("{} nodes, {}+{}", map.nodes.len(), map.erasure.k, map.erasure.m)
    }

    fn head(&self, py: Python<'_>, bucket: String, key: String) -> PyResult<ObjectInfo> {
        let info = self.block(py, |c| async move { c.head(&bucket, &key).await })?;
        Ok(info.into())
    }

    /// The current versions of `keys` ((bucket, key) pairs), in one metadata round per node;
    /// the first error (`NotFound`, ...) is raised.
    fn head_many(&self, py: Python<'_>, keys: Vec<(String, String)>) -> PyResult<Vec<ObjectInfo>> {
        let infos = self.block(py, |c| async move { heads(&c, &keys).await })?;
        Ok(infos.into_iter().map(ObjectInfo::from).collect())
    }

    /// The smallest checksum block an object of `size` bytes may have in this cluster
    /// (`client::Client::smallest_block_bytes`).
    fn smallest_block_bytes(&self, size: u64) -> u32 {
        self.template.smallest_block_bytes(size)
    }

    /// [`RawClient::head_many`] for objects read again and again (gathered tables): the drives
    /// are asked for versions only, and the block checksums of a version this client read
    /// before come from its cache (`client::Client::head_many_cached`).
    fn head_many_cached(&self, py: Python<'_>, keys: Vec<(String, String)>) -> PyResult<Vec<ObjectInfo>> {
        let infos = self
            .block(py, |c| async move { c.head_many_cached(&keys).await.into_iter().collect::<Result<Vec<_>, _>>() })?;
        Ok(infos.into_iter().map(ObjectInfo::from).collect())
    }

    /// `length` bytes (all to the end if None) of the version `info` at `offset`, as new bytes.
    #[pyo3(signature = (info, offset, length))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        info: &ObjectInfo,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        read_bytes(self, py, &info.inner, offset, length)
    }

    /// Reads from the version `info` at `offset` straight into `buffer`; returns the byte count.
    fn read_into(&self, py: Python<'_>, info: &ObjectInfo, buffer: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let mut target = Writable::get(buffer)?;
        read_into(self, py, &info.inner, offset, &mut target)
    }

    /// Rows `indices` (a buffer of native int64) of the table of `rows` rows of `row_bytes`
    /// bytes from `data_offset` in object `info`, row `indices[i]` into `buffer` at
    /// `i * row_bytes`, the GIL released.
    #[pyo3(signature = (info, data_offset, row_bytes, rows, indices, buffer))]
    #[allow(clippy::too_many_arguments)]
    fn gather_into(
        &self,
        py: Python<'_>,
        info: &ObjectInfo,
        data_offset: u64,
        row_bytes: u64,
        rows: u64,
        indices: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let wanted = indices_of(indices)?;
        let mut target = Writable::get(buffer)?;
        let table = client::RowTable { data_offset, row_bytes, rows };
        let slice = target.as_mut_slice();
        let info = &info.inner;
        let cache = self.row_cache();
        self.block(py, |c| async move { c.gather(info, &table, &wanted, slice, cache.as_deref()).await })
    }

    /// [`RawClient::gather_into`] of several tables in one batched read: `items` of (info,
    /// data_offset, row_bytes, rows, indices, buffer). The buffers must not overlap.
    fn gather_many_into(&self, py: Python<'_>, items: Vec<GatherRequest<'_>>) -> PyResult<()> {
        let mut wanted = Vec::with_capacity(items.len());
        for (.., indices, _) in &items {
            wanted.push(indices_of(indices)?);
        }
        let mut writables = items.iter().map(|(.., buffer)| Writable::get(buffer)).collect::<PyResult<Vec<_>>>()?;
        let slices: Vec<RawSlice> = writables.iter_mut().map(|w| RawSlice::of(w.as_mut_slice())).collect();
        check_disjoint(&slices)?;
        let cache = self.row_cache();
        let mut gathers = Vec::with_capacity(items.len());
        for (((info, data_offset, row_bytes, rows, ..), indices), slice) in items.iter().zip(&wanted).zip(&slices) {
            let table = client::RowTable { data_offset: *data_offset, row_bytes: *row_bytes, rows: *rows };
            // SAFETY: the buffers are disjoint (checked above) and held by `writables` for the call.
            gathers.push(client::GatherItem { info: &info.inner, table, indices, out: unsafe { slice.as_mut() } });
        }
        self.block(py, |c| async move { c.gather_many(&mut gathers, cache.as_deref()).await })?;
        drop(writables);
        Ok(())
    }

    /// Sets the capacity of this client's gather row cache in bytes (0 turns it off; a new
    /// capacity starts an empty cache). Each process has its own cache.
    fn set_gather_cache(&self, capacity_bytes: u64) {
        self.cache_bytes.store(capacity_bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The gather row cache's counters: hits, misses, rows, bytes, capacity_bytes.
    fn gather_cache_stats(&self) -> Vec<(&'static str, u64)> {
        let stats = self.row_cache().map(|c| c.stats()).unwrap_or_default();
        vec![
            ("hits", stats.hits),
            ("misses", stats.misses),
            ("rows", stats.rows),
            ("bytes", stats.bytes),
            ("capacity_bytes", stats.capacity_bytes),
        ]
    }

    /// The object (or `length` bytes at `offset`) as bytes.
    #[pyo3(signature = (bucket, key, offset, length))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        bucket: String,
        key: String,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let info = self.block(py, |c| async move { c.head(&bucket, &key).await })?;
        read_bytes(self, py, &info, offset, length)
    }

    /// Reads the object from `offset` straight into `buffer` (no copy); returns the byte count:
    /// the smaller of the buffer's length and the bytes after `offset`.
    fn get_into(
        &self,
        py: Python<'_>,
        bucket: String,
        key: String,
        buffer: &Bound<'_, PyAny>,
        offset: u64,
    ) -> PyResult<usize> {
        let mut target = Writable::get(buffer)?;
        let info = self.block(py, |c| async move { c.head(&bucket, &key).await })?;
        read_into(self, py, &info, offset, &mut target)
    }

    /// Many whole objects: a list of bytes, or, with `buffers` (one per key), a list of byte
    /// counts written into them.
    #[pyo3(signature = (keys, buffers))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<(String, String)>,
        buffers: Option<Vec<Bound<'py, PyAny>>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        match buffers {
            Some(buffers) => get_many_into(self, py, keys, &buffers),
            None => get_many_bytes(self, py, keys),
        }
    }

    /// Writes `data` (any bytes-like object) as `bucket/key`, without copying it; a Parquet
    /// file in the aligned layout when `align`.
    #[pyo3(signature = (bucket, key, data, content_type, user_meta, align=true))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        bucket: String,
        key: String,
        data: &Bound<'_, PyAny>,
        content_type: Option<String>,
        user_meta: Vec<(String, String)>,
        align: bool,
    ) -> PyResult<ObjectInfo> {
        let source = Readable::get(data)?;
        let bytes = source.as_slice();
        let mut options = put_options(content_type, user_meta);
        if align {
            options.align = py.detach(|| ::query::layout::parquet_alignment_of(bytes));
        }
        let info = self.block(py, |c| async move { c.put_bytes(&bucket, &key, bytes, &options).await })?;
        Ok(info.into())
    }

    /// A streaming PUT of `bucket/key`: `write` pieces, then `close` (or `abort`). Name errors
    /// come from the PUT, at the first `write` that fills a piece or at `close`. `block_bytes`:
    /// the object's checksum block size (`client::PutOptions::block_bytes`).
    #[pyo3(signature = (bucket, key, content_type, user_meta, block_bytes=None))]
    fn writer(
        &self,
        bucket: String,
        key: String,
        content_type: Option<String>,
        user_meta: Vec<(String, String)>,
        block_bytes: Option<u32>,
    ) -> PyResult<writer::Writer> {
        let options = client::PutOptions { block_bytes, ..put_options(content_type, user_meta) };
        Ok(writer::Writer::start(self.client()?, bucket, key, options))
    }

    fn delete(&self, py: Python<'_>, bucket: String, key: String) -> PyResult<()> {
        self.block(py, |c| async move { c.delete(&bucket, &key).await })
    }

    fn make_bucket(&self, py: Python<'_>, bucket: String) -> PyResult<()> {
        self.block(py, |c| async move { c.make_bucket(&bucket).await })
    }

    fn remove_bucket(&self, py: Python<'_>, bucket: String) -> PyResult<()> {
        self.block(py, |c| async move { c.remove_bucket(&bucket).await })
    }

    fn list_buckets(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.block(py, |c| async move { c.list_buckets().await })
    }

    fn bucket_exists(&self, py: Python<'_>, bucket: String) -> PyResult<bool> {
        self.block(py, |c| async move { c.bucket_exists(&bucket).await })
    }

    /// One page of keys: `([(key, size, etag, modified_ms), ...], next_start_after or None)`.
    fn list(
        &self,
        py: Python<'_>,
        bucket: String,
        prefix: String,
        start_after: String,
        limit: u32,
    ) -> PyResult<(Vec<ListRow>, Option<String>)> {
        let page = self.block(py, |c| async move { c.list(&bucket, &prefix, &start_after, limit).await })?;
        let entries = page.entries.into_iter().map(|e| (e.key, e.size, e.etag, e.modified_ms)).collect();
        Ok((entries, page.next_start_after))
    }
}

/// One listed object as Python sees it: `(key, size, etag, modified_ms)`.
type ListRow = (String, u64, String, u64);

fn load_config(py: Python<'_>, path: &str) -> PyResult<client::Client> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PyOSError::new_err(format!("read cluster config {path}: {e} (create one with `tessera init`)")))?;
    let base_dir = Path::new(path).parent().unwrap_or(Path::new("."));
    client::Client::from_map_text(&text, base_dir, options())
        .map_err(|e| errors::raise(py, "ConfigError", format!("load {path}: {e}"), &[]))
}

/// How many bytes a read of `length` at `offset` returns, or the error the client gives.
fn read_len(info: &client::ObjectInfo, offset: u64, length: Option<u64>) -> Result<usize, client::Error> {
    let size = info.meta.size;
    if offset > size {
        return Err(client::Error::RangeNotSatisfiable { offset, size });
    }
    let len = length.unwrap_or(u64::MAX).min(size - offset);
    Ok(usize::try_from(len).expect("object sizes fit in usize on 64-bit"))
}

fn read_bytes<'py>(
    raw: &RawClient,
    py: Python<'py>,
    info: &client::ObjectInfo,
    offset: u64,
    length: Option<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let len = read_len(info, offset, length).map_err(errors::to_py)?;
    let (bytes, slice) = fresh_bytes(py, len)?;
    if len > 0 {
        let read = raw.block(py, |c| async move {
            // SAFETY: `bytes` is alive in this frame and not yet visible to anyone else.
            let target = unsafe { slice.as_mut() };
            c.read_at(info, offset, target).await
        })?;
        assert_eq!(read, len, "a read inside the object fills the whole range");
    }
    Ok(bytes)
}

fn read_into(
    raw: &RawClient,
    py: Python<'_>,
    info: &client::ObjectInfo,
    offset: u64,
    target: &mut Writable,
) -> PyResult<usize> {
    let len = read_len(info, offset, Some(target.len() as u64)).map_err(errors::to_py)?;
    if len == 0 {
        return Ok(0);
    }
    let slice = &mut target.as_mut_slice()[..len];
    raw.block(py, |c| async move { c.read_at(info, offset, slice).await })
}

/// Metadata of many objects with one batched request per node; the first error wins.
async fn heads(client: &client::Client, keys: &[(String, String)]) -> Result<Vec<client::ObjectInfo>, client::Error> {
    client.head_many(keys).await.into_iter().collect()
}

/// Whole-object reads of many objects, every fetch round one batched request per node for all
/// of them; the first error wins.
async fn reads(
    client: &client::Client,
    targets: Vec<(&client::ObjectInfo, RawSlice)>,
) -> Result<Vec<usize>, client::Error> {
    let mut batch = Vec::with_capacity(targets.len());
    for (info, slice) in targets {
        // SAFETY: every slice is distinct (checked by the callers) and alive for the call.
        batch.push((info, 0u64, unsafe { slice.as_mut() }));
    }
    client.read_many(batch).await.into_iter().collect()
}

fn get_many_bytes(raw: &RawClient, py: Python<'_>, keys: Vec<(String, String)>) -> PyResult<Vec<Py<PyAny>>> {
    let infos = raw.block(py, |c| async move { heads(&c, &keys).await })?;
    let mut objects = Vec::with_capacity(infos.len());
    let mut targets = Vec::with_capacity(infos.len());
    for info in &infos {
        let len = read_len(info, 0, None).map_err(errors::to_py)?;
        let (bytes, slice) = fresh_bytes(py, len)?;
        objects.push(bytes.into_any().unbind());
        targets.push((info, slice));
    }
    raw.block(py, |c| async move { reads(&c, targets).await })?;
    Ok(objects)
}

fn get_many_into<'py>(
    raw: &RawClient,
    py: Python<'py>,
    keys: Vec<(String, String)>,
    buffers: &[Bound<'py, PyAny>],
) -> PyResult<Vec<Py<PyAny>>> {
    if buffers.len() != keys.len() {
        return Err(PyValueError::new_err(format!("{} keys but {} buffers", keys.len(), buffers.len())));
    }
    let mut writables = buffers.iter().map(Writable::get).collect::<PyResult<Vec<_>>>()?;
    let mut slices: Vec<RawSlice> = writables.iter_mut().map(|w| RawSlice::of(w.as_mut_slice())).collect();
    check_disjoint(&slices)?;
    let infos = raw.block(py, |c| async move { heads(&c, &keys).await })?;
    let mut targets = Vec::with_capacity(infos.len());
    for (info, slice) in infos.iter().zip(slices.iter_mut()) {
        let len = read_len(info, 0, Some(slice.len as u64)).map_err(errors::to_py)?;
        slice.len = len;
        targets.push((info, RawSlice { ptr: slice.ptr, len }));
    }
    let counts = raw.block(py, |c| async move { reads(&c, targets).await })?;
    drop(writables);
    counts.into_iter().map(|n| n.into_pyobject(py).map(|b| b.into_any().unbind()).map_err(PyErr::from)).collect()
}

/// One table of a `gather_many_into`: (info, data_offset, row_bytes, rows, indices, buffer).
type GatherRequest<'py> = (PyRef<'py, ObjectInfo>, u64, u64, u64, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// Gather indices from a buffer of native int64. A negative index becomes one past every
/// table's end, which the gather refuses.
fn indices_of(indices: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let indices = Readable::get(indices)?;
    let bytes = indices.as_slice();
    if bytes.len() % 8 != 0 {
        return Err(PyValueError::new_err("indices must be a buffer of int64"));
    }
    Ok(bytes.chunks_exact(8).map(|b| i64::from_ne_bytes(b.try_into().expect("8 bytes")) as u64).collect())
}

/// Two buffers sharing memory would be two `&mut` to the same bytes.
fn check_disjoint(slices: &[RawSlice]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize)> =
        slices.iter().filter(|s| s.len > 0).map(|s| (s.ptr as usize, s.ptr as usize + s.len)).collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(PyValueError::new_err("the output buffers overlap"));
    }
    Ok(())
}

#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawClient>()?;
    m.add_class::<ObjectInfo>()?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<query::QueryCursor>()?;
    Ok(())
}
