//! The HTTP port's socket, with a listen queue deep enough for a burst of connections.
//!
//! The kernel completes handshakes into the listen queue until the server accepts them; past
//! its length it drops the SYNs, and each such client retries about a second later, unseen
//! by the server. tokio's `TcpListener::bind` asks for 128, which a burst of a few hundred
//! clients overflows (measured: 400 streamed requests at once lost ~320 connections that way,
//! and the median request its first token a second later; uvicorn asks for 2048).

use std::io;

use tokio::net::{TcpListener, TcpSocket};

/// The listen queue asked for; the kernel caps it at `net.core.somaxconn` (4096 from Linux
/// 5.4, 128 before).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `address` (host:port; a name is resolved, its first address that binds wins)
/// with SO_REUSEADDR, as `TcpListener::bind` does, and a queue of LISTEN_BACKLOG.
pub async fn listen(address: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        let attempt = || {
            let socket = match addr {
                std::net::SocketAddr::V4(_) => TcpSocket::new_v4()?,
                std::net::SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(LISTEN_BACKLOG)
        };
        match attempt() {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e), // e.g. IPv6 off on this host: the next address
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;
    use std::time::Duration;

    /// Connections the kernel completes while nobody accepts: the queue's length (+1). A
    /// connect that times out found the queue full; any other error fails the test.
    fn queued(addr: std::net::SocketAddr, most: usize) -> Vec<TcpStream> {
        let mut held = Vec::new();
        while held.len() < most {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(stream) => held.push(stream),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
                Err(e) => panic!("connect {} failed: {e}", held.len()),
            }
        }
        held
    }

    fn proc_number(path: &str, field: Option<&str>) -> Option<usize> {
        let text = std::fs::read_to_string(path).ok()?;
        match field {
            None => text.trim().parse().ok(),
            Some(name) => text
                .lines()
                .find(|l| l.starts_with(name))?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok(),
        }
    }

    #[tokio::test]
    async fn a_burst_larger_than_128_waits_in_the_queue_instead_of_being_dropped() {
        // The kernel's cap and our open-file limit bound what can be shown here.
        let somaxconn = proc_number("/proc/sys/net/core/somaxconn", None).unwrap_or(128);
        let files = proc_number("/proc/self/limits", Some("Max open files")).unwrap_or(1024);
        let want = somaxconn.min(600).min(files.saturating_sub(100));
        if want <= 129 {
            eprintln!("not checked: somaxconn {somaxconn}, open files {files}");
            return;
        }
        let listener = listen("127.0.0.1:0").await.unwrap();
        let held = queued(listener.local_addr().unwrap(), want);
        assert!(held.len() >= want, "{} of {want} queued", held.len());
    }

    #[tokio::test]
    async fn names_resolve_and_a_taken_port_is_an_error() {
        let named = listen("localhost:0").await.unwrap();
        assert!(named.local_addr().unwrap().ip().is_loopback());
        let taken = listen("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = listen(&addr).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
    }
}
