//! The ringlock server binary: flags, logging, then [`ringlock::server::run`].

use clap::Parser;

fn main() {
    // Buffers of 128 KiB and more (a slow reader's unsent replies) are
    // mapped and unmapped on their own. glibc would otherwise raise this
    // threshold as such buffers are freed and then serve them from its
    // heap, which it rarely gives back: after a flood of slow readers the
    // server would keep their memory for good.
    // SAFETY: mallopt has no preconditions; it runs before any other thread.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
    let config = ringlock::config::Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level).unwrap_or_else(|error| {
        eprintln!(
            "ringlock: --log-level {:?} is not a log filter ({error}); use error, warn, info, debug or trace",
            config.log_level
        );
        std::process::exit(2);
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    if let Err(error) = ringlock::server::run(config) {
        tracing::error!("{error}");
        eprintln!("ringlock: {error}");
        std::process::exit(1);
    }
}
