fn main() {
    eprintln!("ringlock-bench: not built yet");
    std::process::exit(1)
}
