//! Near-data SQL from Python: the `query` crate's stream of Arrow record batches, handed to
//! Python as Arrow IPC bytes (pyarrow reads them without copying the columns again).

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use query::arrow::ipc::writer::StreamWriter;

use crate::errors;
use crate::runtime::runtime;

/// The Python exception for a query error.
pub(crate) fn to_py(error: query::Error) -> PyErr {
    match error {
        query::Error::Client(e) => errors::to_py(e),
        other => Python::attach(|py| errors::raise(py, "QueryError", other.to_string(), &[])),
    }
}

/// A running query: pieces of one Arrow IPC stream, the schema first. Dropping it (or `close`)
/// stops the query on every node.
#[pyclass(module = "tessera._tessera", frozen)]
pub(crate) struct QueryCursor {
    state: Mutex<Option<Running>>,
    counters: std::sync::Arc<query::QueryCounters>,
}

struct Running {
    stream: query::datafusion::execution::SendableRecordBatchStream,
    writer: StreamWriter<Vec<u8>>,
}

impl std::fmt::Debug for QueryCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueryCursor")
    }
}

impl QueryCursor {
    pub(crate) fn start(
        py: Python<'_>,
        client: client::Client,
        sql: String,
        pushdown: bool,
        memory: usize,
    ) -> PyResult<Self> {
        let started = py.detach(|| {
            runtime().block_on(async move {
                let mut options = query::QueryOptions { pushdown, ..Default::default() };
                options.limits.memory_bytes = memory;
                query::start(&client, &sql, &options).await
            })
        });
        let started = started.map_err(to_py)?;
        let writer = StreamWriter::try_new(Vec::new(), &started.schema).map_err(|e| arrow_error(py, e))?;
        let counters = started.counters;
        Ok(Self { state: Mutex::new(Some(Running { stream: started.stream, writer })), counters })
    }
}

fn arrow_error(py: Python<'_>, error: impl std::fmt::Display) -> PyErr {
    errors::raise(py, "QueryError", format!("Arrow IPC: {error}"), &[])
}

#[pymethods]
impl QueryCursor {
    /// The next piece of the IPC stream (the first holds the schema, the last its end marker);
    /// None once the stream is complete.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut slot = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(running) = slot.as_mut() else {
            return Ok(None);
        };
        let mut out = std::mem::take(running.writer.get_mut());
        if !out.is_empty() {
            return Ok(Some(PyBytes::new(py, &out)));
        }
        let next = py.detach(|| runtime().block_on(running.stream.next()));
        match next {
            Some(Ok(batch)) => {
                running.writer.write(&batch).map_err(|e| arrow_error(py, e))?;
                out = std::mem::take(running.writer.get_mut());
                Ok(Some(PyBytes::new(py, &out)))
            }
            Some(Err(e)) => {
                *slot = None;
                Err(to_py(query::stream_error(e)))
            }
            None => {
                let mut running = slot.take().expect("checked above");
                running.writer.finish().map_err(|e| arrow_error(py, e))?;
                Ok(Some(PyBytes::new(py, running.writer.get_ref())))
            }
        }
    }

    /// Stops the query (every node's part of it). Waits, without the GIL, for a `next` running
    /// on another thread (which holds the lock while it waits for the nodes without the GIL).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        });
    }

    /// What the query moved so far: node requests, result bytes from the nodes, bytes the
    /// nodes read, row groups and bytes the client read itself.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.counters;
        let dict = PyDict::new(py);
        dict.set_item("node_requests", c.node_requests.load(Ordering::Relaxed))?;
        dict.set_item("result_bytes", c.result_bytes.load(Ordering::Relaxed))?;
        dict.set_item("node_read_bytes", c.node_read_bytes.load(Ordering::Relaxed))?;
        dict.set_item("node_peer_bytes", c.node_peer_bytes.load(Ordering::Relaxed))?;
        dict.set_item("client_row_groups", c.client_row_groups.load(Ordering::Relaxed))?;
        dict.set_item("client_read_bytes", c.client_read_bytes.load(Ordering::Relaxed))?;
        dict.set_item("bytes_to_client", c.bytes_to_client())?;
        Ok(dict)
    }
}
