//! Orders the device work of a process's sessions around CUDA graph captures.
//!
//! CubeCL captures in CUDA's global capture mode: while one stream records, a synchronising call
//! from any thread of the process (a read, an allocation, a copy from the host) fails and
//! invalidates the capture. Every device operation of a [`crate::Session`] and of
//! [`crate::Model::load`] therefore holds the shared side of one process-wide lock, and a capture
//! holds the exclusive side: it waits for the operations in flight, and they wait for it (a few
//! milliseconds, once per session). Sessions on many threads then work side by side; device work
//! of the same process outside this crate is not ordered by it.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static DEVICE_USE: RwLock<()> = RwLock::new(());

/// Held by an ordinary device operation (many at once).
pub(crate) fn shared() -> RwLockReadGuard<'static, ()> {
    DEVICE_USE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a graph capture (alone).
pub(crate) fn exclusive() -> RwLockWriteGuard<'static, ()> {
    DEVICE_USE.write().unwrap_or_else(PoisonError::into_inner)
}

/// The shared or the exclusive side.
pub(crate) enum Guard {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// The exclusive side when `capturing`, else the shared side.
pub(crate) fn for_step(capturing: bool) -> Guard {
    if capturing {
        Guard::Exclusive(exclusive())
    } else {
        Guard::Shared(shared())
    }
}
