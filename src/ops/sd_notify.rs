//! systemd's readiness protocol (`Type=notify`): one datagram to the unix
//! socket named by `$NOTIFY_SOCKET`. Without the variable (not started by
//! systemd, or another `Type=`) every call does nothing.
//!
//! The protocol is one `sendto`, so it is written here with std rather than
//! taken from a crate: `READY=1` once the node serves, `STOPPING=1` when a
//! stop signal came, and a `STATUS=` line for `systemctl status`.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=value` lines) to systemd, if it
/// asked for notifications. Failures are logged: they must not stop the
/// server, but an operator whose unit times out at start wants to know why.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(error) = send(&path, state) {
        tracing::warn!("cannot notify systemd through NOTIFY_SOCKET={path:?}: {error}");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    // A leading '@' names a socket in the abstract namespace.
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &address)?;
    } else {
        socket.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_the_named_socket() {
        let directory = std::env::temp_dir().join(format!("ringlock-notify-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let receiver = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        let mut buffer = [0u8; 64];
        let read = receiver.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..read], b"READY=1\nSTATUS=serving");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
