//! Bytes a TCP connection put on the wire, from the kernel's `TCP_INFO`: payload (TLS records
//! and all) plus the IP and TCP headers of every segment, pure ACKs included — what a link
//! is billed for, short of the link layer.

use std::os::fd::AsRawFd;

/// One direction of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// Payload bytes (for the sending direction retransmissions included: what went out).
    pub payload: u64,
    pub segments: u64,
}

impl Flow {
    /// Payload plus `header` bytes per segment.
    pub fn wire_bytes(&self, header: u64) -> u64 {
        self.payload + self.segments * header
    }

    pub fn saturating_sub(self, earlier: Flow) -> Flow {
        Flow {
            payload: self.payload.saturating_sub(earlier.payload),
            segments: self.segments.saturating_sub(earlier.segments),
        }
    }
}

impl std::ops::Add for Flow {
    type Output = Flow;
    fn add(self, o: Flow) -> Flow {
        Flow {
            payload: self.payload + o.payload,
            segments: self.segments + o.segments,
        }
    }
}

impl std::ops::AddAssign for Flow {
    fn add_assign(&mut self, o: Flow) {
        *self = *self + o;
    }
}

/// Both directions of a connection as its own end sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub sent: Flow,
    pub received: Flow,
    /// IP + TCP header bytes per segment on this connection (40, or 52 with timestamps; 60
    /// and 72 for IPv6).
    pub header: u64,
}

impl Counts {
    pub fn sent_bytes(&self) -> u64 {
        self.sent.wire_bytes(self.header)
    }

    pub fn received_bytes(&self) -> u64 {
        self.received.wire_bytes(self.header)
    }
}

/// The connection's counts, or `None` when the kernel does not say (not TCP, not Linux).
pub fn counts<S: AsRawFd>(socket: &S) -> Option<Counts> {
    counts_of_fd(socket.as_raw_fd())
}

#[cfg(target_os = "linux")]
fn counts_of_fd(fd: std::os::fd::RawFd) -> Option<Counts> {
    // SAFETY: tcp_info is plain data; the kernel writes at most `len` bytes into it and says
    // how many in `len`.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // Fields up to tcpi_bytes_sent (Linux 4.19) are needed.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_retrans);
    if rc != 0 || (len as usize) < needed {
        return None;
    }
    const TCPI_OPT_TIMESTAMPS: u8 = 1;
    let ipv6 = socket_is_ipv6(fd);
    let header = if ipv6 { 60 } else { 40 }
        + if info.tcpi_options & TCPI_OPT_TIMESTAMPS != 0 {
            12
        } else {
            0
        };
    Some(Counts {
        sent: Flow {
            payload: info.tcpi_bytes_sent,
            segments: u64::from(info.tcpi_segs_out),
        },
        received: Flow {
            payload: info.tcpi_bytes_received,
            segments: u64::from(info.tcpi_segs_in),
        },
        header,
    })
}

#[cfg(target_os = "linux")]
fn socket_is_ipv6(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: sockaddr_storage is large enough for any address; the kernel fills `len`.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockname(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    rc == 0 && i32::from(addr.ss_family) == libc::AF_INET6
}

#[cfg(not(target_os = "linux"))]
fn counts_of_fd(_fd: std::os::fd::RawFd) -> Option<Counts> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_loopback_exchange_is_counted_both_ways() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(&[7u8; 1000]).unwrap();
        let mut buf = [0u8; 1000];
        server.read_exact(&mut buf).unwrap();
        server.write_all(&[1u8; 10]).unwrap();
        client.read_exact(&mut buf[..10]).unwrap();
        let c = counts(&client).expect("TCP_INFO");
        assert_eq!(c.sent.payload, 1000);
        assert_eq!(c.received.payload, 10);
        assert!(c.sent.segments >= 2, "SYN and data: {c:?}");
        assert!(c.header == 40 || c.header == 52, "{c:?}");
        assert!(c.sent_bytes() >= 1000 + 2 * c.header);
        let s = counts(&server).expect("TCP_INFO");
        assert_eq!(s.received.payload, 1000);
        assert_eq!(s.sent.payload, 10);
    }

    #[test]
    fn a_socket_that_is_not_tcp_has_no_counts() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(counts(&udp), None);
    }
}
