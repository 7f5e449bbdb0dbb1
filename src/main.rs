/// mimalloc rather than glibc's malloc: a request allocates and frees hundreds of small blocks,
/// which cost a fifth of its instructions with glibc (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    rota::cli::main()
}
