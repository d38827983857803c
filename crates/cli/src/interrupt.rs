//! Ctrl-C and SIGTERM: the first one asks the running command to stop at the next safe point
//! (between uploaded tensors while loading, between tokens while generating), so that the text
//! generated so far is flushed and the program exits with status 130; a second one exits at once.
//!
//! The signals are blocked in every thread and taken by one waiting thread (`sigwait`), not by a
//! handler: a handler runs on whichever thread the kernel picks, and a driver or runtime thread
//! whose system call is interrupted there may treat that as fatal.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a run stopped by a signal (128 + SIGINT, as shells report it).
pub const EXIT_STATUS: u8 = 130;

/// Blocks SIGINT and SIGTERM and starts the thread that waits for them (no-op off Unix). Must run
/// before any other thread is started, so that they all inherit the blocked mask.
pub fn install() {
    #[cfg(unix)]
    // SAFETY: plain libc calls on a locally owned signal set; `_exit` is the documented way out
    // of a process without running destructors that other threads may be inside.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        std::thread::spawn(move || loop {
            let mut signal = 0;
            if libc::sigwait(&set, &mut signal) == 0 && REQUESTED.swap(true, Ordering::SeqCst) {
                libc::_exit(EXIT_STATUS as libc::c_int);
            }
        });
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Forgets a stop that was handled without ending the program (`chat` stops one answer), so
/// that the next signal is again a request and not the second, immediate exit.
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}
