/// mimalloc rather than glibc's malloc: a request allocates and frees hundreds of small blocks,
/// which cost a fifth of its instructions with glibc (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // mimalloc commits its arenas eagerly; where transparent huge pages are on for every
    // mapping (`always`), each page it touches is backed by a whole 2 MiB one: idle RSS 27 MB
    // instead of 17. What `MIMALLOC_ALLOW_THP=0` does, before the server allocates.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_thp_disable(true);
    rota::cli::main()
}
