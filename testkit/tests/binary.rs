//! The `ringlock-testkit` binary as other languages' tests use it: started
//! as a process, driven over its control socket, ended by closing its
//! standard input.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Sends `command`, returns the whole reply line.
fn call(control: &mut (BufReader<TcpStream>, TcpStream), command: &str) -> String {
    control.1.write_all(format!("{command}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    control.0.read_line(&mut reply).unwrap();
    reply.trim_end().to_string()
}

#[test]
fn the_kit_serves_its_control_protocol_and_ends_with_its_standard_input() {
    let mut kit = Command::new(env!("CARGO_BIN_EXE_ringlock-testkit"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(kit.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    let address = first_line.trim_end().strip_prefix("ringlock-testkit control ").expect("the control address");
    let stream = TcpStream::connect(address).unwrap();
    let mut control = (BufReader::new(stream.try_clone().unwrap()), stream);
    assert_eq!(call(&mut control, "ping"), "ok");

    // A server that answers each line it reads with the same line.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let server_address = server.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in server.incoming().flatten() {
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = writer.write_all(format!("{line}\n").as_bytes());
                }
            });
        }
    });
    let reply = call(&mut control, &format!("proxy {server_address}"));
    let fields: Vec<&str> = reply.split(' ').collect();
    assert_eq!(fields[..2], ["ok", "0"], "{reply}");
    let mut client = TcpStream::connect(fields[2]).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut replies = BufReader::new(client.try_clone().unwrap());
    client.write_all(b"one\n").unwrap();
    let mut line = String::new();
    replies.read_line(&mut line).unwrap();
    assert_eq!(line, "one\n");

    // Reordered: two answers that come together go out last first.
    assert_eq!(call(&mut control, "reorder 0 on"), "ok");
    client.write_all(b"two\nthree\n").unwrap();
    let mut both = String::new();
    replies.read_line(&mut both).unwrap();
    replies.read_line(&mut both).unwrap();
    assert_eq!(both, "three\ntwo\n");
    assert_eq!(call(&mut control, "resume 0"), "ok");
    assert_eq!(call(&mut control, "wait-upstream 0 - two").split(' ').next(), Some("ok"));
    assert!(call(&mut control, "fly 0").starts_with("err unknown command"));

    // Closing its standard input ends the kit, and with it the proxy.
    drop(kit.stdin.take());
    assert!(kit.wait().unwrap().success());
    let mut rest = Vec::new();
    assert!(matches!(client.read_to_end(&mut rest), Ok(_) | Err(_)));
    assert!(TcpStream::connect(fields[2]).is_err(), "the proxy is gone with the kit");
}
