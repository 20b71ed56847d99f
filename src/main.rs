fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    hob::cli::signals::ignore_file_size_signal();
    let result = hob::cli::parse(std::env::args_os().collect()).and_then(hob::cli::main_with);
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
