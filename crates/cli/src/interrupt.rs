//! Ctrl-C and SIGTERM: the first one asks the running command to stop at the next safe point
//! (between uploaded tensors while loading, between tokens while generating), so that the text
//! generated so far is flushed and the program exits with status 130; a second one exits at once.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a run stopped by a signal (128 + SIGINT, as shells report it).
pub const EXIT_STATUS: u8 = 130;

/// Installs the handler for SIGINT and SIGTERM (no-op off Unix).
pub fn install() {
    #[cfg(unix)]
    // SAFETY: `on_signal` only touches an atomic and calls the async-signal-safe `_exit`.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

#[cfg(unix)]
extern "C" fn on_signal(_: libc::c_int) {
    if REQUESTED.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe; nothing else runs in the handler.
        unsafe { libc::_exit(EXIT_STATUS as libc::c_int) };
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
