//! `client::Error` to the exception classes of `tessera.errors` (defined in Python, so they can
//! subclass the nearest built-in: a missing object is a `FileNotFoundError`).

use pyo3::BoundObject as _;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Raises the `tessera.errors` class named `class` with `message` and keyword attributes.
pub(crate) fn raise(py: Python<'_>, class: &str, message: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("tessera.errors")?.getattr(class)?;
        let kwargs = PyDict::new(py);
        for (name, value) in attrs {
            kwargs.set_item(*name, value)?;
        }
        Ok(PyErr::from_value(cls.call((message.clone(),), Some(&kwargs))?))
    };
    build().unwrap_or_else(|e| e)
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> Py<PyAny> {
    value.into_pyobject(py).map(|b| b.into_any().unbind()).unwrap_or_else(|_| py.None())
}

/// The Python exception for a client error.
pub(crate) fn to_py(error: client::Error) -> PyErr {
    Python::attach(|py| convert(py, error))
}

fn convert(py: Python<'_>, error: client::Error) -> PyErr {
    use client::Error as E;
    let message = error.to_string();
    match error {
        E::NotFound { bucket, key } => {
            raise(py, "NotFound", message, &[("bucket", obj(py, bucket)), ("key", obj(py, key))])
        }
        E::NoSuchBucket { bucket } => raise(py, "NoSuchBucket", message, &[("bucket", obj(py, bucket))]),
        E::BucketNotEmpty { bucket } => raise(py, "BucketNotEmpty", message, &[("bucket", obj(py, bucket))]),
        E::InvalidName(_) => raise(py, "InvalidName", message, &[]),
        E::Unavailable { bucket, key, available, total, needed, unreachable, .. } => raise(
            py,
            "Unavailable",
            message,
            &[
                ("bucket", obj(py, bucket)),
                ("key", obj(py, key)),
                ("available", obj(py, available)),
                ("total", obj(py, total)),
                ("needed", obj(py, needed)),
                ("unreachable", obj(py, unreachable.into_iter().map(|n| n.node).collect::<Vec<_>>())),
            ],
        ),
        E::WriteQuorum { bucket, key, acked, total, needed, .. } => raise(
            py,
            "WriteQuorum",
            message,
            &[
                ("bucket", obj(py, bucket)),
                ("key", obj(py, key)),
                ("available", obj(py, acked)),
                ("total", obj(py, total)),
                ("needed", obj(py, needed)),
                ("unreachable", obj(py, Vec::<String>::new())),
            ],
        ),
        E::NodeUnreachable { node, .. } | E::NodeDown { node, .. } => {
            raise(py, "NodeUnavailable", message, &[("node", obj(py, node))])
        }
        E::Timeout { node, .. } => raise(py, "Timeout", message, &[("node", obj(py, node))]),
        E::AuthRejected { node } => raise(py, "AuthRejected", message, &[("node", obj(py, node))]),
        E::DiskFull { node } => raise(py, "DiskFull", message, &[("node", obj(py, node))]),
        E::RangeNotSatisfiable { offset, size } => {
            raise(py, "RangeNotSatisfiable", message, &[("offset", obj(py, offset)), ("size", obj(py, size))])
        }
        E::Map(_) | E::NodeTlsConfig(_) => raise(py, "ConfigError", message, &[]),
        E::BadGather(_) => raise(py, "GatherError", message, &[]),
        E::Source(_) => raise(py, "SourceError", message, &[]),
        _ => raise(py, "TesseraError", message, &[]),
    }
}
