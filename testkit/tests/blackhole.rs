//! The proxy's black hole: connections stay open, bytes go in, nothing
//! comes out in either direction, neither a reset nor a close, until it is
//! lifted; then the black-holed connections are cut and new ones forwarded.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringlock_testkit::control::Kit;

/// A server that answers each line with the same line, and keeps every
/// line it received.
fn echo_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    seen.lock().unwrap().push(line.clone());
                    let _ = writer.write_all(format!("{line}\n").as_bytes());
                }
            });
        }
    });
    (address, received)
}

fn echoes(client: &mut TcpStream, line: &str) -> bool {
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    client.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = vec![0u8; line.len() + 1];
    client.read_exact(&mut reply).is_ok() && reply == format!("{line}\n").as_bytes()
}

/// True if `client` gets neither a byte nor an end within a short look: the
/// connection is open and silent.
fn silent(client: &mut TcpStream) -> bool {
    client.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut byte = [0u8; 1];
    matches!(client.read(&mut byte), Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// True once `client` sees its connection end (a close or a reset).
fn ended(client: &mut TcpStream) -> bool {
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut rest = Vec::new();
    match client.read_to_end(&mut rest) {
        Ok(_) => rest.is_empty(),
        Err(error) => !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

#[test]
fn a_black_holed_proxy_takes_bytes_answers_nothing_and_cuts_its_connections_when_lifted() {
    let (server, received) = echo_server();
    let kit = Kit::default();
    let started = kit.execute(&format!("proxy {server}")).unwrap();
    let (id, address) = started.split_once(' ').unwrap();
    let mut before = TcpStream::connect(address).unwrap();
    assert!(echoes(&mut before, "one"));

    assert_eq!(kit.execute(&format!("blackhole {id} on")), Ok(String::new()));
    before.write_all(b"two\n").unwrap();
    assert!(kit.execute(&format!("wait-upstream {id} - two")).is_ok(), "the proxy read the bytes");
    // A connection made during the black hole is accepted, and as silent.
    let mut during = TcpStream::connect(address).unwrap();
    during.write_all(b"three\n").unwrap();
    assert!(kit.execute(&format!("wait-upstream {id} 0 three")).is_ok());
    assert!(silent(&mut before), "no reply and no close on the black-holed connection");
    assert!(silent(&mut during), "no reply and no close on a connection made in the black hole");
    assert_eq!(kit.execute(&format!("blackholed {id}")), Ok("2 0 1".to_string()));
    assert_eq!(kit.execute(&format!("open {id}")), Ok("2 0 1".to_string()));

    assert_eq!(kit.execute(&format!("blackhole {id} off")), Ok(String::new()));
    assert!(ended(&mut before), "a black-holed connection is cut when the black hole is lifted");
    assert!(ended(&mut during));
    let mut after = TcpStream::connect(address).unwrap();
    assert!(echoes(&mut after, "four"), "new connections are forwarded again");
    assert_eq!(*received.lock().unwrap(), ["one", "four"], "nothing of the black hole reached the server");
    assert_eq!(kit.execute(&format!("blackholed {id}")), Ok("0".to_string()));
}

#[test]
fn one_connection_can_be_black_holed_while_the_others_are_forwarded() {
    let (server, received) = echo_server();
    let kit = Kit::default();
    let started = kit.execute(&format!("proxy {server}")).unwrap();
    let (id, address) = started.split_once(' ').unwrap();
    let mut first = TcpStream::connect(address).unwrap();
    assert!(echoes(&mut first, "one"));
    let mut second = TcpStream::connect(address).unwrap();
    assert!(echoes(&mut second, "two"));

    assert_eq!(kit.execute(&format!("blackhole {id} on 0")), Ok(String::new()));
    first.write_all(b"lost\n").unwrap();
    assert!(kit.execute(&format!("wait-upstream {id} 1 lost")).is_ok());
    assert!(echoes(&mut second, "three"), "the other connection is still forwarded");
    assert!(silent(&mut first));
    assert_eq!(kit.execute(&format!("blackholed {id}")), Ok("1 0".to_string()));
    let mut third = TcpStream::connect(address).unwrap();
    assert!(echoes(&mut third, "four"), "new connections are not black-holed");

    assert_eq!(kit.execute(&format!("blackhole {id} off 0")), Ok(String::new()));
    assert!(ended(&mut first));
    assert!(echoes(&mut second, "five"));
    assert!(!received.lock().unwrap().contains(&"lost".to_string()));
    assert!(kit.execute(&format!("blackhole {id} maybe")).is_err());
}
