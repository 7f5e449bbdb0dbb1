/// mimalloc rather than glibc's malloc: a request allocates and frees hundreds of small blocks,
/// which cost a fifth of its instructions with glibc (docs/performance.md).
#[global_allocator]
static ALLOCATOR: rota_alloc::MiMalloc = rota_alloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // mimalloc commits its arenas eagerly; where transparent huge pages are on for every
    // mapping (`always`), each page it touches is backed by a whole 2 MiB one: idle RSS 27 MB
    // instead of 17. What `MIMALLOC_ALLOW_THP=0` does, before the server allocates.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_thp_disable(true);
    // What a burst freed goes back to the OS a second or two later: each worker thread hands
    // its free pages back when it goes idle, and this thread returns what is due even while
    // every worker sleeps (docs/gateway.md, "Bounds at the door").
    let _ = std::thread::Builder::new().name("give-back".into()).spawn(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            rota_alloc::give_back_freed();
        }
    });
    rota::cli::main(rota_alloc::give_back_freed)
}
