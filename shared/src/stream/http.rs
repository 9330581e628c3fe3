//! The raw HTTP/1.1 that exec/attach carry through the tunnel: the edge writes the upgrade
//! request to the runtime's streaming server and relays its answer byte for byte (the
//! `101 Switching Protocols` head included), so the cloud reads a response head out of DATA
//! frames before it can answer the apiserver.

use std::fmt::Write as _;

/// Largest response head accepted (Go's `http.DefaultMaxHeaderBytes` is 1 MiB; a
/// streaming server's answer is a few hundred bytes).
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers in one head at most.
const MAX_HEADERS: usize = 100;

/// A parsed response status line and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
}

impl ResponseHead {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    #[error("HTTP response head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed HTTP response head: {0}")]
    Malformed(String),
}

/// Parses the response head at the start of `buf`: `Ok(None)` while it is incomplete,
/// otherwise the head and how many bytes it took (what follows is body or upgraded data).
pub fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Err(HeadError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if end + 4 > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let text =
        std::str::from_utf8(&buf[..end]).map_err(|_| HeadError::Malformed("not ASCII".into()))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(HeadError::Malformed(format!("status line {status_line:?}")));
    }
    let status = parts
        .next()
        .filter(|s| s.len() == 3)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| HeadError::Malformed(format!("status line {status_line:?}")))?;
    let reason = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(HeadError::Malformed("too many headers".into()));
        }
        let (k, v) = line
            .split_once(':')
            .filter(|(k, _)| !k.is_empty() && !k.contains([' ', '\t']))
            .ok_or_else(|| HeadError::Malformed(format!("header line {line:?}")))?;
        headers.push((k.to_string(), v.trim().to_string()));
    }
    Ok(Some((
        ResponseHead {
            status,
            reason,
            headers,
        },
        end + 4,
    )))
}

/// Headers that belong to one hop and are not forwarded with a request.
pub fn is_hop_header(name: &str) -> bool {
    [
        "host",
        "content-length",
        "transfer-encoding",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// An HTTP/1.1 request head without a body: `method target` with `Host: host` and `headers`
/// (hop-by-hop ones other than `Connection`/`Upgrade` left out; CR/LF in values dropped).
pub fn request_head<'a>(
    method: &str,
    target: &str,
    host: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let clean = |s: &str| s.replace(['\r', '\n'], "");
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        clean(method),
        clean(target),
        clean(host)
    );
    for (k, v) in headers {
        if is_hop_header(k) || k.is_empty() {
            continue;
        }
        let _ = write!(out, "{}: {}\r\n", clean(k), clean(v));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Decodes a complete chunked body; `None` while the last chunk has not arrived (or when it
/// is malformed, which the caller treats as incomplete until the peer ends).
pub fn decode_chunked(mut buf: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&buf[..line_end]).ok()?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        buf = &buf[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if buf.len() < size.checked_add(2)? {
            return None;
        }
        out.extend_from_slice(&buf[..size]);
        buf = &buf[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switching_protocols_head_and_what_follows() {
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nDate: x\r\n\r\n\x80\x03\x00\x01";
        for cut in 0..raw.len() - 4 {
            assert_eq!(parse_response_head(&raw[..cut]), Ok(None), "cut at {cut}");
        }
        let (head, used) = parse_response_head(raw).unwrap().unwrap();
        assert_eq!(head.status, 101);
        assert_eq!(head.reason, "Switching Protocols");
        assert_eq!(head.header("upgrade"), Some("SPDY/3.1"));
        assert_eq!(
            head.header("x-stream-protocol-version"),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(&raw[used..], b"\x80\x03\x00\x01");
    }

    #[test]
    fn error_heads_and_bad_input() {
        let (head, used) =
            parse_response_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!")
                .unwrap()
                .unwrap();
        assert_eq!(
            (head.status, head.header("Content-Length")),
            (404, Some("5"))
        );
        assert_eq!(used, 45);
        // x/net/websocket's refusal: a status line and nothing else.
        let (h, _) = parse_response_head(b"HTTP/1.1 403 Forbidden\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.headers.is_empty() && h.status == 403);
        assert!(parse_response_head(b"SSH-2.0-x\r\n\r\n").is_err());
        assert!(parse_response_head(b"HTTP/1.1 99 x\r\n\r\n").is_err());
        assert!(parse_response_head(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n").is_err());
        assert!(parse_response_head(b"HTTP/1.1 200 OK\r\nBad Name: v\r\n\r\n").is_err());
        let endless = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(parse_response_head(&endless), Err(HeadError::TooLarge));
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        big.extend(b"X-A: b\r\n".repeat(MAX_HEAD / 8));
        big.extend(b"\r\n");
        assert_eq!(parse_response_head(&big), Err(HeadError::TooLarge));
    }

    #[test]
    fn request_heads_leave_out_hop_headers_and_line_breaks() {
        let head = request_head(
            "POST",
            "/exec/abc",
            "127.0.0.1:4000",
            [
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
                ("X-Stream-Protocol-Version", "v3.channel.k8s.io"),
                ("Content-Length", "0"),
                ("Host", "evil"),
                ("X-Evil", "a\r\nInjected: yes"),
            ],
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /exec/abc HTTP/1.1\r\nHost: 127.0.0.1:4000\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
             X-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io\r\n\
             X-Evil: aInjected: yes\r\n\r\n"
        );
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            decode_chunked(b"5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n"),
            Some(b"hello!".to_vec())
        );
        assert_eq!(decode_chunked(b"5\r\nhel"), None);
        assert_eq!(decode_chunked(b"5\r\nhello\r\n"), None);
        assert_eq!(decode_chunked(b"zz\r\n"), None);
    }
}
