//! One tokio runtime per process, and fork detection.
//!
//! A forked child (a DataLoader worker) inherits the parent's memory but none of its threads:
//! the parent's runtime and every socket registered with it are unusable there, and dropping
//! them would deregister the parent's sockets from the shared epoll instance. So each process
//! builds its own runtime on first use, and whatever belonged to another process is leaked,
//! never dropped.

use std::sync::Mutex;

use tokio::runtime::Runtime;

/// Worker threads of the runtime: the client's work is I/O and checksums, the caller's thread
/// drives each request's future itself.
const WORKER_THREADS: usize = 2;

static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// The runtime of this process, built on first use (again in a forked child).
pub(crate) fn runtime() -> &'static Runtime {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, runtime)) = *slot
        && owner == pid
    {
        return runtime;
    }
    // The previous runtime, if any, belongs to the parent process: leaked on purpose (it is a
    // `&'static`), its threads do not exist here.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name("tessera-io")
        .enable_all()
        .build()
        .expect("a tokio runtime builds unless the process is out of threads or file descriptors");
    let runtime: &'static Runtime = Box::leak(Box::new(runtime));
    *slot = Some((pid, runtime));
    runtime
}

/// A value that belongs to the process that made it; in a forked child it is rebuilt, and the
/// parent's copy is leaked (see the module docs).
#[derive(Debug)]
pub(crate) struct PerProcess<T> {
    slot: Mutex<Option<(u32, T)>>,
}

impl<T: Clone> PerProcess<T> {
    pub(crate) fn new() -> Self {
        Self { slot: Mutex::new(None) }
    }

    /// This process's value, if it has one (and forgets another process's).
    pub(crate) fn get(&self) -> Option<T> {
        let pid = std::process::id();
        let mut slot = self.slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match slot.take() {
            Some((owner, value)) if owner == pid => {
                let copy = value.clone();
                *slot = Some((owner, value));
                Some(copy)
            }
            Some(foreign) => {
                std::mem::forget(foreign);
                None
            }
            None => None,
        }
    }

    /// Stores this process's value in place of the one it had (another process's is forgotten,
    /// as in [`PerProcess::get`]).
    pub(crate) fn replace(&self, value: T) {
        let pid = std::process::id();
        let mut slot = self.slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match slot.take() {
            Some((owner, _)) if owner == pid => {}
            other => std::mem::forget(other),
        }
        *slot = Some((pid, value));
    }

    /// Stores this process's value, unless another thread stored one first; returns the kept one.
    pub(crate) fn set(&self, value: T) -> T {
        let pid = std::process::id();
        let mut slot = self.slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match slot.take() {
            Some((owner, kept)) if owner == pid => {
                let copy = kept.clone();
                *slot = Some((owner, kept));
                copy
            }
            other => {
                std::mem::forget(other);
                *slot = Some((pid, value.clone()));
                value
            }
        }
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let slot = self.slot.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((owner, value)) = slot.take()
            && owner != std::process::id()
        {
            std::mem::forget(value);
        }
    }
}
