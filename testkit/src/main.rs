//! `ringlock-testkit`: serves the test kit's proxies and fake standbys over
//! a control socket (see `testkit/README.md`), until its standard input
//! closes.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};

fn main() {
    let mut control = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--control" => match args.next().map(|value| value.parse()) {
                Some(Ok(address)) => control = address,
                _ => fail("--control needs an address such as 127.0.0.1:7800"),
            },
            "-h" | "--help" => {
                println!(
                    "ringlock-testkit [--control ADDR]\n\n\
                     Serves proxies and fake standbys for client tests over a line protocol on ADDR\n\
                     (default 127.0.0.1:0, a free port; the first line printed names it), until\n\
                     standard input closes. See testkit/README.md for the commands."
                );
                return;
            }
            other => fail(&format!("unknown argument {other:?}; see --help")),
        }
    }
    let listener = TcpListener::bind(control)
        .unwrap_or_else(|error| fail(&format!("cannot listen on {control}: {error}; pick another --control")));
    let address = listener.local_addr().unwrap_or_else(|error| fail(&format!("cannot read the address: {error}")));
    println!("ringlock-testkit control {address}");
    let kit = ringlock_testkit::control::Kit::default();
    std::thread::spawn(move || kit.serve(&listener));
    // The test that started the kit holds its standard input: when that
    // test ends, however it ends, the kit ends with it.
    let mut sink = [0u8; 64];
    while matches!(std::io::stdin().read(&mut sink), Ok(count) if count > 0) {}
}

fn fail(message: &str) -> ! {
    eprintln!("ringlock-testkit: {message}");
    std::process::exit(2)
}
