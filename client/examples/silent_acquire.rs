//! Times one acquire on a node that has gone silent, for
//! `scripts/silent-connection.sh`.
//!
//! Connects to the address given, pings, prints `ready`, and waits for a
//! line on standard input (the script black-holes the address meanwhile);
//! then acquires a key with a lease of 10 s and a wait of 1 s through the
//! blocking API and prints the seconds the call took and how it ended.
//!
//! ```text
//! cargo run --release -p ringlock-client --example silent_acquire -- 127.0.0.1:7700
//! ```

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use ringlock_client::{Client, Error};

fn main() {
    let Some(address) = std::env::args().nth(1) else {
        eprintln!("usage: silent_acquire ADDRESS");
        std::process::exit(2);
    };
    let client = Client::connect([address]).expect("valid settings");
    client.ping().expect("the node answers before it goes silent");
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    let started = Instant::now();
    let outcome =
        client.acquire(format!("silent/{}", std::process::id()), Duration::from_secs(10), Some(Duration::from_secs(1)));
    let elapsed = started.elapsed().as_secs_f64();
    let how = match outcome {
        Ok(Some(_)) => "granted".to_string(),
        Ok(None) => "timed out".to_string(),
        Err(Error::NoConnection { .. }) => "Error::NoConnection".to_string(),
        Err(other) => format!("{other:?}"),
    };
    println!("{elapsed:.2} {how}");
}
