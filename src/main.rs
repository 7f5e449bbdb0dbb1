fn main() -> std::process::ExitCode {
    rota::cli::main()
}
