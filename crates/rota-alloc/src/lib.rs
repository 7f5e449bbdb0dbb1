//! rota's allocator, mimalloc (docs/performance.md), and what safe Rust cannot ask of it: to give
//! freed memory back to the OS on time (docs/gateway.md, "Bounds at the door").

pub use mimalloc::MiMalloc;

/// Gives back to the OS what this thread's heap and every arena hold free. On its own, mimalloc
/// returns freed memory a second after it was freed, and only when a thread later frees a whole
/// page: a server that goes back to ordinary requests after a burst of large bodies would keep
/// the burst's memory for good. It walks the thread's pages, so call it now and then (rota:
/// once a second per thread), from any thread.
#[allow(unsafe_code)]
pub fn give_back_freed() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
