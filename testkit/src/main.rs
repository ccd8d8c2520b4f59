//! `ringlock-testkit`: serves the test kit's proxies and fake standbys over
//! a control socket (see `testkit/README.md`), until its standard input
//! closes; `ringlock-testkit certs DIR` writes the certificates of TLS
//! tests instead.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};

fn main() {
    let mut control = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("certs") {
        args.next();
        return certs(args.collect());
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--control" => match args.next().map(|value| value.parse()) {
                Some(Ok(address)) => control = address,
                _ => fail("--control needs an address such as 127.0.0.1:7800"),
            },
            "-h" | "--help" => {
                println!(
                    "ringlock-testkit [--control ADDR]\n\
                     ringlock-testkit certs DIR\n\n\
                     Serves proxies and fake standbys for client tests over a line protocol on ADDR\n\
                     (default 127.0.0.1:0, a free port; the first line printed names it), until\n\
                     standard input closes. See testkit/README.md for the commands.\n\n\
                     With `certs`, writes fresh test certificates and keys (PEM) into DIR and exits:\n\
                     ca.pem, server.pem, server-key.pem, client.pem, client-key.pem, other-ca.pem,\n\
                     expired.pem, expired-key.pem, wrong-name.pem, wrong-name-key.pem."
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

/// `certs DIR`: writes the certificate set, prints the directory.
fn certs(args: Vec<String>) {
    let [dir] = args.as_slice() else { fail("certs needs one argument, the directory to write into; see --help") };
    let dir = std::path::Path::new(dir);
    if let Err(error) = ringlock_testkit::certs::write_all(dir) {
        fail(&error.to_string());
    }
    println!("ringlock-testkit certs {}", dir.display());
}

fn fail(message: &str) -> ! {
    eprintln!("ringlock-testkit: {message}");
    std::process::exit(2)
}
