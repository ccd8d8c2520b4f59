//! Clients that ask for far more than they read: each connection sends
//! requests as fast as its socket takes them and never reads a reply. The
//! server holds a bounded amount for them (`--max-unsent-mb`, 64 KiB of
//! unparsed input each), keeps serving a bystander, closes the ones that
//! stay stuck past `--output-stall-ms`, and gives their memory back.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, metrics_address, scrape, wait_until};

/// Connections that never read.
const READERS: usize = 300;

/// Opens `count` connections that send `line` over and over for `flood`
/// without reading anything; returns them, still open.
fn flood(server: &Server, count: usize, line: &[u8], flood: Duration) -> Vec<TcpStream> {
    let batch: Vec<u8> = line.iter().copied().cycle().take(line.len() * (8192 / line.len())).collect();
    let streams: Vec<TcpStream> = (0..count)
        .map(|_| {
            let stream = TcpStream::connect(server.addr).unwrap();
            stream.set_nonblocking(true).unwrap();
            stream
        })
        .collect();
    let end = Instant::now() + flood;
    while Instant::now() < end {
        for mut stream in &streams {
            let _ = stream.write(&batch);
        }
    }
    streams
}

#[test]
fn readers_that_never_read_cost_a_bounded_memory_and_a_bystander_is_served_throughout() {
    let server = Server::start(&[
        "--max-unsent-mb",
        "16",
        "--output-stall-ms",
        "1000",
        "--metrics-listen",
        "127.0.0.1:0",
        "--max-connections-per-ip",
        "0",
    ]);
    let metrics = metrics_address(&server);
    let mut bystander = server.connect();
    bystander.acquire("bystander", "60", "5");
    let before = server.rss_bytes();

    // `S` replies are some hundred bytes each: the flood asks for far more
    // than it could ever be sent.
    let streams = flood(&server, READERS, b"S\n", Duration::from_secs(3));
    let during = server.rss_bytes();
    assert!(bystander.call("P").starts_with("P active "), "the bystander is served during the flood");
    let token = bystander.acquire("bystander/2", "60", "5");
    assert!(bystander.call(&format!("R bystander/2 {token}")).starts_with("R "));
    // Without the bounds, 300 readers flooding `P` grew the server to
    // 3.6 GB (scripts/slow-readers.py against the earlier binary: the input
    // they sent, kept unparsed, and up to 1 MiB of replies each); with them,
    // the budget and 64 KiB in and out per connection.
    let grown = during.saturating_sub(before);
    assert!(grown < 300 << 20, "{READERS} readers that never read grew the server by {} MiB", grown >> 20);

    // They stay stuck: past --output-stall-ms the server closes them.
    wait_until("the stuck readers to be closed", || {
        scrape(metrics).get("ringlock_output_stall_closes_total").copied().unwrap_or(0.0) >= READERS as f64
    });
    let squeezes = scrape(metrics).get("ringlock_output_squeezes_total").copied().unwrap_or(0.0);
    assert!(squeezes >= 1.0, "the flood went over the budget: {squeezes}");
    drop(streams);
    // Their buffers go back to the system, not only to the allocator.
    wait_until("the memory of the closed connections to be given back", || {
        server.rss_bytes() < before + (grown / 2).max(32 << 20)
    });
    assert!(bystander.call("P").starts_with("P active "), "the bystander's connection is untouched");
}

/// The kernel send buffers of the server's connections to `port`, as `ss`
/// reports them (`tb`: the buffer's size, twice the SO_SNDBUF asked for).
fn server_send_buffers(port: u16) -> Vec<u64> {
    let output = std::process::Command::new("ss")
        .args(["-tmnH", "state", "established", &format!("( sport = :{port} )")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    text.split("tb")
        .skip(1)
        .map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn client_connections_get_the_send_buffer_asked_for_and_the_kernels_sizing_with_zero() {
    let server = Server::start(&["--send-buffer-kib", "48"]);
    let mut client = server.connect();
    assert!(client.call("P").starts_with("P active "));
    // The kernel doubles what is asked for its bookkeeping.
    assert_eq!(server_send_buffers(server.addr.port()), vec![96 << 10]);

    let automatic = Server::start(&["--send-buffer-kib", "0"]);
    let mut client = automatic.connect();
    assert!(client.call("P").starts_with("P active "));
    let buffers = server_send_buffers(automatic.addr.port());
    assert_eq!(buffers.len(), 1);
    assert_ne!(buffers[0], 96 << 10, "without --send-buffer-kib the kernel sizes the buffer");
}
